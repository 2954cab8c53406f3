"""`python -m vanilla_transformer.cli`: the `vanilla-transformer` command."""

from .main import main

main()
