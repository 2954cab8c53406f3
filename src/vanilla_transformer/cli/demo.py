"""`vanilla-transformer demo`: a model's translation page in the browser (`web/page.py`), served on this machine by
Gradio, decoding with the backends of `translate` (`backends/table.py`). The model is checked and loaded as
`translate` loads it, and the address before either, so that a mistake is one line before any wait."""

import argparse
import errno
import os
import socket

from ..backends.table import BACKENDS
from ..errors import CommandParser, UserError
from ..extras import require
from .arguments import device, port_number
from .translate import backend_translator

# Gradio's own defaults, and the environment variables that change them (as in a Hub Space).
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7860


DESCRIPTION = ("Serve a page to try a model in the browser: type sentences, see their translations, each one's "
               "n-best list with scores and the alignment of its best translation as a heatmap; decoding options on "
               "the page. Ctrl-C stops it.")


def _demo_parser() -> CommandParser:
    parser = CommandParser(prog="vanilla-transformer demo", description=DESCRIPTION)
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="A saved model folder or a Hub id USER/NAME; with --backend ct2, an export-ct2 folder; "
                        "with --backend onnx, an export-onnx folder (no alignment: its decoder returns no attention).")
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="torch", help="What runs the model.")
    parser.add_argument("--device", type=device, help="cpu, cuda, cuda:1, ... (default: cuda when available).")
    parser.add_argument("--host", metavar="H",
                        help="The address to serve on (default: GRADIO_SERVER_NAME, else 127.0.0.1, this machine only; "
                        "0.0.0.0 for every network interface).")
    parser.add_argument("--port", type=port_number, metavar="N",
                        help="The port to serve on (default: GRADIO_SERVER_PORT, else 7860).")
    return parser


def demo_command(argv: list[str]) -> None:
    args = _demo_parser().parse_args(argv)
    require("gradio", extra="demo")
    host = args.host or os.environ.get("GRADIO_SERVER_NAME") or DEFAULT_HOST
    port = args.port or _environment_port()
    _check_free(host, port)
    for name, value in (("compile", False), ("batch_size", 32), ("num_beams", None), ("max_new_tokens", None)):
        setattr(args, name, value)  # translate's options the page does not change: their defaults
    translate = backend_translator(args)
    from ..web.page import launch, translation_page

    page = translation_page(args.model, backend=args.backend, translate=translate)
    print(f"the translation page of {args.model} is at http://{host}:{port} (Ctrl-C stops it)", flush=True)
    try:
        launch(page, host=host, port=port, quiet=True)
    except OSError as error:  # the port was taken while the model loaded
        raise UserError(f"cannot serve on {host}:{port}: {error}") from None


def _environment_port() -> int:
    """GRADIO_SERVER_PORT, as Gradio reads it, else 7860."""
    value = os.environ.get("GRADIO_SERVER_PORT")
    if value is None:
        return DEFAULT_PORT
    try:
        return port_number(value)
    except argparse.ArgumentTypeError as error:
        raise UserError(f"GRADIO_SERVER_PORT: {error}") from None


def _check_free(host: str, port: int) -> None:
    """A `UserError` unless the page can listen on `host`:`port`: a port in use, or an address not of this machine."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except socket.gaierror as error:
        raise UserError(f"--host {host}: not an address of this machine ({error.strerror})") from None
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise UserError(f"port {port} on {host} is in use: choose another with --port N") from None
        raise UserError(f"cannot serve on {host}:{port}: {error.strerror or error}") from None
