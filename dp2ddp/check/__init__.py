"""`dp2ddp check`: the rules of :mod:`dp2ddp.rules` over many files, fast.

One module per job, each importing only those below it (no circle):

* :mod:`~dp2ddp.check.results` — what checking produces (``Diagnostic``, ``FileResult``, ``Job``);
* :mod:`~dp2ddp.check.noqa` — ``# noqa`` comments;
* :mod:`~dp2ddp.check.analyze` — one file's findings: gates, ``ast``, model, rules;
* :mod:`~dp2ddp.check.cache` — the result cache (findings per content digest);
* :mod:`~dp2ddp.check.fix` — ``--fix``/``--diff``: the only LibCST use;
* :mod:`~dp2ddp.check.engine` — one file: read, cache, findings, ``--new-only`` lines, fix, write;
* :mod:`~dp2ddp.check.pool` — many files, in processes when it pays;
* :mod:`~dp2ddp.check.git` — ``--new-only``/``--since``: the lines a change adds;
* :mod:`~dp2ddp.check.config` — ``[tool.dp2ddp]`` in pyproject.toml;
* :mod:`~dp2ddp.check.output` — text, JSON, SARIF, GitHub annotations;
* :mod:`~dp2ddp.check.command` — the command itself (its options: :mod:`dp2ddp.cli.check`).
"""
