"""Argument types the commands share, each naming what it expects when a value is refused."""

import argparse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:  # argparse would name this function instead of what is expected
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def device(text: str) -> str:
    import torch

    try:
        torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected a device such as cpu, cuda or cuda:1, got {text!r}") from None
    return text


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number (1-65535), got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number (1-65535), got {value}")
    return value
