"""The parts of SubprocVecEnv, private to it: import SubprocVecEnv, WorkerError and WorkerTimeout from
common.multiprocessing_env.

    worker.py           the worker process: its loop, the wire protocol, and EnvGroup (the code that steps envs)
    env_hosts.py        where the envs live, seen from the caller: WorkerPool (worker processes), InProcessPool
    layout.py           where the envs step by default, decided by a probe process
    messages.py         length-prefixed messages over a socketpair
    shared_block.py     the shared-memory block the workers write observations, rewards and flags into
    process_control.py  start methods, the main-guard check, lifelines, signals, ending process groups
    env_state.py        an env pickled whole, for checkpoints that resume bit for bit
    batching.py         the batched spaces and infos of a vector env, from each env's
    arguments.py        what SubprocVecEnv is given, checked before anything starts
"""
