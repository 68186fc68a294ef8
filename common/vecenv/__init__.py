"""The parts of SubprocVecEnv (import it and its errors from multiprocessing_env.py beside this folder): each
module's first line says its job; docs/vecenv.md has the map (worker.py: the protocol, the life of a step)."""
