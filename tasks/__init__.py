"""Task files (TOML), installed as `nlptrain.tasks`; `--task NAME` finds NAME.toml here."""
