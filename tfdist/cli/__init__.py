"""The `tfdist` command line: one module per command (`check`, `launch`, `env`, `estimate`,
`export`, `tensorboard`, `cluster-server`, `data-service`, `model-server`, `model-export`),
each declaring its own flags (`FLAGS_DECLARED`, of `flags.Flag`) with its `USAGE` made from
them, its docstring as its help and a `run(args, task)` returning an exit code
(`tfdist.exit_codes`); `task` is `--task` parsed (a `TaskConfig`), or None.

Takes: argv and each command's declared flags (a command reads only its own).
Gives: the exit code, one line on stderr for bad input (`tfdist COMMAND: <file>: <key>: ...`),
and the generated references of the docs site (`reference.py`).
Never imports: TensorFlow before a command needs it (a bad config is refused first); nothing
imports `cli` but `tfdist.__main__`.
"""
