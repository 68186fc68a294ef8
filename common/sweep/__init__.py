"""Runs a script over several env ids and seeds, each run in its normal runs/ folder, and summarizes
them.

    python -m <package>.sweep ppo_vec.py --env-ids CartPole-v1 Acrobot-v1 --seeds 1 2 3 -- --num-envs 8
    python -m <package>.sweep ppo_vec.py --env-ids Hopper-v5 Walker2d-v5 --seeds 1-10 --executor slurm \\
        --partition gpu --timeout-min 240 --cpus-per-task 8 --jobs 20 -- --total-timesteps 1000000
    python path/to/<package>/sweep path/to/ppo_vec.py --env-ids CartPole-v1 --seeds 1-3 --report reports/x

(<package>: the folder that holds this one, common/ or the name you copied it as.) A run is one (env
id, seed) under --exp-name (default: the script's name) with the flags after --, run from this
folder. Run the same command again and finished runs are skipped, stopped or failed ones resume from
their checkpoint, missing ones start: a sweep is re-runnable and resumable, on one machine or on a
cluster. A run is reused only if it was made with the same flags, but for those that change nothing
learned (--checkpoint-interval, --num-workers, ...: <package>/run/flags.py's TOLERATED). Under
--anneal-lr (the default) --total-timesteps must match too, the learning rate falling over the whole
run; with --no-anneal-lr a run not past the steps asked is extended to them. With other flags a new
run starts beside it, and the sweep says why. A run another process is writing is never started
twice. Engines, none written here: --executor local runs --jobs runs at a time in a thread pool
(they end with the sweep, and Ctrl-C stops them, each saving); --executor slurm submits a SLURM job
array through submitit (at most --jobs at once; a job preempted or out of time stops its run, which
saves, and requeues itself to resume it); --executor submitit-local is submitit's local executor,
the same path as SLURM, on this machine. --report DIR writes DIR/report.md (per env: the runs, their
steps and the flags that differ from the script's defaults, mean +- std and IQM with a 95% bootstrap
interval over seeds of the last-20 return; runs missing, running, unfinished or unreadable named,
never averaged) and DIR/<env>.png (mean and 95% band against global step and wall time)."""
