"""One slice of a job that comes back until its run is done: runs a training script (or torchrun with
it) as a child, and says by its exit status whether the job should come back. What the batch scripts
beside it run on each node; run it yourself in a batch script of your own, or outside Slurm:

    srun python slurm/launch.py ppo_vec.py --env-id Hopper-v5
    srun python slurm/launch.py torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:29400 ppo_atari_multigpu.py --total-timesteps 50000000

It names the run --run-id $SLURM_JOB_ID (an array's task: <array job id>_<task id>, and --seed
$SLURM_ARRAY_TASK_ID unless --seed is given), unless --run-id or --resume is given: then that run goes on.
Its stop signals are set before anything else, so that a notice in a slice's first second is seen
(the script's own are not set yet); each is passed on to the child. It exits 0 if the run is done (a
notice during its final evaluation included), 128 + the signal if a stop signal came before the run
was done (the job should come back), else the child's status. torchrun ends in the ranks' own lines:
its traceback on a stop, and the rendezvous' errors and C++ warnings of a node whose peer left once
the run had ended, are left out."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STOPS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGXCPU]


class Slice:
    """The stop signals this process received, passed on to the child's process group."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.child: subprocess.Popen | None = None
        for signum in STOPS:
            signal.signal(signum, self._forward)

    def _forward(self, signum: int, frame: object) -> None:
        self.signum = self.signum or signum
        if self.child is not None and self.child.returncode is None:
            try:
                os.killpg(self.child.pid, signum)
            except ProcessLookupError:
                pass


def flag_value(argv: list[str], name: str) -> str | None:
    """The value of --name in argv (--name VALUE or --name=VALUE), or None."""
    for k, word in enumerate(argv):
        if word == name and k + 1 < len(argv):
            return argv[k + 1]
        if word.startswith(name + "="):
            return word.partition("=")[2]
    return None


def with_run(args: list[str]) -> list[str]:
    """The script's arguments with the run this job trains named (see the module's docstring)."""
    if flag_value(args, "--run-id") is not None or flag_value(args, "--resume") is not None:
        return args
    job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if job and task:
        seed = [] if flag_value(args, "--seed") is not None else ["--seed", task]
        return ["--run-id", f"{job}_{task}", *seed, *args]
    return ["--run-id", os.environ["SLURM_JOB_ID"], *args] if "SLURM_JOB_ID" in os.environ else args


def summary_of(args: list[str], since: float) -> str | None:
    """The status in the run's summary.json if this slice wrote it (or None)."""
    resume, run_id = flag_value(args, "--resume"), flag_value(args, "--run-id")
    folders = [Path(resume).parent] if resume else sorted(Path("runs").glob(f"*__{run_id}")) if run_id else []
    for summary in (folder / "summary.json" for folder in folders):
        try:
            if summary.stat().st_mtime >= since:
                text = summary.read_text()
                return text.split('"status": "', 1)[1].split('"', 1)[0] if '"status": "' in text else None
        except OSError:
            continue
    return None


def torchrun(argv: list[str], since: float) -> int:
    """torch.distributed.run's main in this process, its errors as the slice's status: the ranks said why."""
    os.environ["LOGLEVEL"] = "CRITICAL"  # torchrun's own log lines
    import logging

    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import main

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # the warnings are the ranks': they stop together
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        main(argv)
    except SignalException as exc:
        return 128 + exc.sigval
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if failure.exitcode - 128 not in STOPS:  # a stopped rank said so itself
            print(f"torchrun: rank {rank} exited with {failure.exitcode}: its own lines above say why", file=sys.stderr)
        return failure.exitcode if 0 < failure.exitcode < 256 else 1
    except (RendezvousError, DistError) as exc:  # the rendezvous' host, a peer's torchrun, is gone
        script = next(k for k, word in enumerate(argv) if word.endswith(".py"))
        if summary_of(argv[script + 1 :], since) not in (None, "running"):
            return 1  # it left once the run had ended: the ranks' lines are the last word
        print(f"torchrun: the rendezvous failed ({type(exc).__name__}: {str(exc).splitlines()[0]})", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    here = Slice()  # first of all: a notice from now on is seen
    since = time.time()
    if argv[:1] == ["--torchrun-agent"]:  # the child of `launch.py torchrun ...`
        return torchrun(argv[2:], float(argv[1]))
    with_torchrun = argv[:1] == ["torchrun"]
    words = argv[1:] if with_torchrun else argv
    script = next((k for k, word in enumerate(words) if word.endswith(".py")), None)
    if script is None:
        print("launch.py: error: name the training script (a .py file), e.g. launch.py ppo_vec.py", file=sys.stderr)
        return 2
    args = with_run(words[script + 1 :])
    agent = [__file__, "--torchrun-agent", str(since)] if with_torchrun else []
    command = [sys.executable, *agent, *words[: script + 1]]
    env = dict(os.environ, PPO_VEC_END_WITH_PARENT=str(os.getpid()))  # common/run/stops.py: stops if this dies
    if with_torchrun:  # c10d's C++ warnings (TCPStore's, of a peer gone), unless asked for
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    here.child = subprocess.Popen([*command, *args], env=env, start_new_session=True)
    if here.signum is not None:  # it came while the child was starting
        os.killpg(here.child.pid, here.signum)
    status = here.child.wait()
    done = summary_of(args, since)
    if done is not None and done.startswith("done"):
        return 0
    stopped = here.signum or (status - 128 if status - 128 in STOPS else -status if -status in STOPS else None)
    if stopped is not None:
        return 128 + stopped
    if status < 0:
        name = signal.Signals(-status).name
        print(f"launch.py: {words[script]} was killed by {name}: its last save stands", file=sys.stderr)
        return 128 - status
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
