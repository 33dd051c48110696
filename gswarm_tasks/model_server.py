"""`python -m gswarm_tasks.model_server ...`: the built-in model server's command, where users and the `builtin`
preset start it; the server itself is `serving/model_server.py`."""

from .serving.model_server import main

if __name__ == "__main__":
    raise SystemExit(main())
