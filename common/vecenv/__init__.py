"""The parts of SubprocVecEnv (import it, WorkerError and WorkerTimeout from multiprocessing_env.py
beside this folder): worker.py the worker process and its protocol, env_hosts.py the envs seen from
the caller (worker processes, or this process), layout.py where they step by default,
shared_block.py the arrays the workers write, messages.py the pipe, process_control.py starting and
ending processes, env_state.py an env pickled whole for checkpoints."""
