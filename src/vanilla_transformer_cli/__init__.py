"""The `vanilla-transformer` console script. Being imported first, it tells `vanilla_transformer` that the command line
started the process, whose package __init__ then stays lazy (no torch or transformers for `--help`)."""


def main() -> None:
    from vanilla_transformer.cli.main import main as run

    run()
