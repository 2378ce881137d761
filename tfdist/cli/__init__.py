"""The `tfdist` command line: one module per command (`check`, `launch`, `env`, `estimate`,
`export`, `tensorboard`, `cluster-server`, `model-server`, `model-export`), each with its
`USAGE`, its docstring as its help and a `run(args, task)` returning an exit code
(`tfdist.exit_codes`); `task` is `--task` parsed (a `TaskConfig`), or None.

Takes: argv and the flags of `flags.py` (each command reads only its own, `COMMAND_FLAGS`).
Gives: the exit code, one line on stderr for bad input (`tfdist COMMAND: <file>: <key>: ...`),
and the generated references of the docs site (`reference.py`).
Never imports: TensorFlow before a command needs it (a bad config is refused first); nothing
imports `cli` but `tfdist.__main__`.
"""
