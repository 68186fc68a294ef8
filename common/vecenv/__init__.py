"""The parts of SubprocVecEnv (import it and its errors from multiprocessing_env.py beside this
folder): worker.py the protocol (the life of a step) and the worker process, pools.py the envs seen
from the caller, errors.py what their failures raise, layout.py where they step by default,
shared_block.py the arrays the workers write, messages.py the pipe, process_control.py starting and
ending processes, env_state.py an env's state as data."""
