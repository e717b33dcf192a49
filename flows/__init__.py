"""Orchestration: the root config, the Prefect flows, the ``lifecycle`` CLI (the only package importing Prefect).
Nothing imports ``flows``. Its modules sit in layers, each importing only from the layers below it (a checked
contract: ``[tool.importlinter]`` in pyproject.toml, run by ``make lint``; drawn in docs/architecture.md):

    cli                                  the parser and main(): collects the commands
    commands                             one module per group of commands, each declared next to its handler
    loop | schedule                      lifecycle-run (the whole loop); the four scheduled deployments
    retrain                              the retrain flow (one, with its ending as a parameter) and retrain-check
    train | evaluate | rollout | monitor the single flows (Prefect tasks and flows over the adapters)
    signals                              drift report and retrain decision (monitoring stage adapters)
    curation | gating | traffic          curated conversations, eval and gate adapters, simulated users
    stages                               training and registry adapters, serve_spec / open_serving_store
    summaries                            the typed results flows return and commands print
    config : runconfig                   the root config

Only the flow modules (train, evaluate, rollout, monitor, retrain, loop, schedule) import Prefect; the adapters
below them are plain Python the CLI and tests call directly.

The import rule: imports sit at the top of the module. Heavy third-party packages (torch, transformers, vLLM,
DeepSpeed, lm-eval, Evidently, BentoML) may be imported inside the function that needs them, in the stage package
that wraps them, so that importing a module does not pay for a path it does not take. One first-party exception,
in the commands only: a handler imports the flows and adapters it runs inside its body. Those modules import
Prefect, MLflow and Hugging Face at their top, and those libraries read their settings from the environment when
imported (Prefect's home, HF_HOME, offline mode), which ``commands.base.Context`` sets from ``--home`` only once
the command line is parsed (``core.runtime.configure``); it also keeps ``lifecycle --help`` at a fraction of a
second instead of ~4 s. Types the commands name from such modules are imported under ``TYPE_CHECKING``.
"""
