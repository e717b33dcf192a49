"""Orchestration: the root config, the Prefect flows, the ``lifecycle`` CLI (the only package importing Prefect).
Nothing imports ``flows``. Its modules sit in layers, each importing only from the layers below it (a checked
contract: ``[tool.importlinter]`` in pyproject.toml, run by ``make lint``; drawn in docs/architecture.md):

    cli                                  the parser and main(): collects the commands
    commands                             one module per group of commands, each declared next to its handler
    loop | schedule                      lifecycle-run (the whole loop); the scheduled deployments
    retrain                              the retrain flow (one, with its ending as a parameter) and retrain-check
    train | evaluate | rollout | monitor the single flows (Prefect tasks and flows over the adapters)
    signals | preference                 drift report and retrain decision; the preference stage (pairs, DPO)
    curation | gating | traffic          curated conversations, eval and gate adapters, simulated users
    stages | report_card                 training and registry adapters, serve_spec / open_serving_store; the run's
                                         report card (Markdown from a RunSummary, pure)
    summaries                            the typed results flows return and commands print
    config : runconfig                   the root config

Only the flow modules (train, evaluate, rollout, monitor, retrain, loop, schedule) import Prefect; the adapters
below them are plain Python the CLI and tests call directly.

Imports follow the project's import rule, written once in docs/architecture.md ("The import rule"): at the top of
the module, except heavy third-party packages used on one path only, and the command handlers' imports of the
flows they run (after ``commands.base.Context`` has configured the process from ``--home``).
"""
