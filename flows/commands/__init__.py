"""The ``lifecycle`` commands, each declared once next to its handler (``base.command``: name, help, example,
arguments), grouped by what they act on; ``flows.cli`` collects them into the parser in the order of its
``GROUPS``."""
