"""`vanilla-transformer model-card` and `push`: a saved model's Hub model card, and the model uploaded with it. The Hub
is asked one quick question before anything is sent to it (`hub.reachability.hub_unreachable`), and a push that it
refuses or the network drops is one line (`cli.errors.hub_errors`)."""

import argparse
from pathlib import Path

from ..paths.disk import folder_size, write_errors
from ..errors import CommandParser, UserError, describe
from ..extras import require
from ..paths.files import check_output_file
from ..paths.folders import no_such_folder
from ..hub.card_facts import CardFactsError
from ..hub.reachability import check_model, hub_unreachable
from ..paths.model_folders import check_tokenizer_fits
from .errors import hub_errors, user_errors


def _card_arguments(parser: argparse.ArgumentParser, results_flag: str, model_required: bool = True) -> None:
    parser.add_argument("--model", required=model_required,
                        help="A saved model folder (from train, average or save_pretrained).")
    parser.add_argument(
        results_flag,
        metavar="FILE",
        help="JSON with the evaluation results and card facts (see vanilla_transformer.hub; `evaluate --json` writes "
        "one); default: the run's card_results.json (written by train), else its test_results.json, else "
        "eval_results.json.",
    )
    parser.add_argument("--run", help="The training run folder, for the recipe and results (default: --model).")
    parser.add_argument(
        "--license",
        default="apache-2.0",
        metavar="ID",
        help="The license of the model, a Hub license id (mit, cc-by-4.0, ...): the card's metadata declares it "
        "and its body says it was chosen with --license (default: apache-2.0).",
    )
    parser.add_argument("--demo-space", metavar="USER/NAME",
                        help="A Hub Space with the model's translation page (push --space): the card links to it.")


def _check_card_arguments(args: argparse.Namespace, results: str | None, weights: bool, tokenizer: bool) -> dict:
    """The card facts (`hub.card_facts.read_card_facts`), after checking the folders and the results file they come from."""
    from ..hub.card_facts import read_card_facts

    check_model(args.model, weights=weights, tokenizer=tokenizer, hub=False)
    if tokenizer:  # a folder shared with its tokenizer: the two must fit
        check_tokenizer_fits(args.model)
    if args.run is not None and not Path(args.run).is_dir():
        raise UserError(f"{args.run} is a file, not a folder" if Path(args.run).exists() else no_such_folder(args.run))
    if results is not None and not Path(results).is_file():
        raise UserError(f"{results} is a folder, not a file" if Path(results).is_dir() else f"no such file: {results}")
    with user_errors(CardFactsError, OSError):  # read and checked before the model is loaded
        return read_card_facts(results, args.run or args.model)


def model_card_command(argv: list[str]) -> None:
    parser = CommandParser(
        prog="vanilla-transformer model-card",
        description="Generate the Hub model card (README.md) of a saved model from its config and results.",
    )
    _card_arguments(parser, "--results")
    parser.add_argument("--repo-id", help="USER/NAME used in the card's usage examples.")
    parser.add_argument(
        "--out",
        required=True,
        help="Where to write the card, e.g. model_cards/NAME/README.md (its figures go beside it).",
    )
    args = parser.parse_args(argv)
    from ..hub.card import write_model_card

    facts = _check_card_arguments(args, args.results, weights=False, tokenizer=False)
    check_output_file(args.out, new_folders=True)  # a card is often a new folder, its figures beside it
    with user_errors(CardFactsError, OSError), write_errors(Path(args.out).parent):
        write_model_card(args.model, args.out, facts, run_dir=args.run, repo_id=args.repo_id, license=args.license,
                         demo_space=args.demo_space)
    print(f"model card written to {args.out}")


def _push_parser() -> CommandParser:
    parser = CommandParser(
        prog="vanilla-transformer push",
        description="Upload a saved model, its tokenizer, code and a generated model card to the Hub in one commit; "
        "or, with --space, a Space that serves the translation page of a model on the Hub.",
    )
    _card_arguments(parser, "--card-results", model_required=False)
    parser.add_argument("--repo-id", help="USER/NAME of the Hub repository (created if missing).")
    parser.add_argument("--space", metavar="USER/NAME",
                        help="Upload instead a Gradio Space (created if missing) serving the translation page of "
                        "--model-repo (vanilla-transformer demo): app.py, requirements.txt and its README.")
    parser.add_argument("--model-repo", metavar="USER/NAME", help="With --space: the Hub model the page translates with.")
    parser.add_argument("--space-requirement", metavar="SPEC",
                        help="With --space: the line of the Space's requirements.txt that installs this package "
                        "(default: vanilla-transformer[demo]==VERSION, the installed version; e.g. a Git URL).")
    parser.add_argument("--private", action="store_true", help="Create the repository as private.")
    parser.add_argument("--commit-message", default="Upload vanilla-transformer model")
    parser.add_argument("--token", help="A Hub token with write access (default: the one of `hf auth login`).")
    parser.add_argument(
        "--dry-run",
        metavar="OUT",
        help="Write the folder that would be uploaded (model, tokenizer, code, card and its figures; or the Space's "
        "files) into OUT instead, without any network access.",
    )
    parser.add_argument("--force", action="store_true", help="With --dry-run: replace what OUT holds.")
    return parser


def push_command(argv: list[str]) -> None:
    args = _push_parser().parse_args(argv)
    from ..hub.push import push_to_hub

    if args.force and args.dry_run is None:
        raise UserError("--force replaces the folder of --dry-run; without --dry-run there is nothing to replace")
    if args.space is not None or args.model_repo is not None or args.space_requirement is not None:
        _push_space(args)
        return
    for flag, value in (("--model", args.model), ("--repo-id", args.repo_id)):
        if value is None:
            raise UserError(f"{flag} is required to push a model (or give --space and --model-repo for a Space)")
    require("jinja2", extra="train")  # the card's, before the Hub is asked anything
    facts = _check_card_arguments(args, args.card_results, weights=True, tokenizer=True)
    _check_repo_id(args.repo_id)
    if args.dry_run is not None:
        _dry_run(args, facts)
        return
    _check_hub_for_push()
    with hub_errors(f"push to {args.repo_id}"):
        commit = push_to_hub(
            args.model,
            args.repo_id,
            private=args.private,
            results=facts,
            run_dir=args.run,
            license=args.license,
            commit_message=args.commit_message,
            token=args.token,
            demo_space=args.demo_space,
        )
    print(f"pushed to {commit.commit_url}")


def _push_space(args: argparse.Namespace) -> None:
    """push --space USER/NAME --model-repo USER/MODEL: the Space of the model's translation page (`web/space.py`)."""
    from ..paths.text_files import output_folder
    from ..web.space import push_space, write_space

    given = [flag for flag, value in (("--model", args.model), ("--repo-id", args.repo_id), ("--run", args.run),
                                      ("--card-results", args.card_results), ("--demo-space", args.demo_space))
             if value is not None]
    if given:
        raise UserError(f"--space uploads a page for a model already on the Hub (--model-repo), not {given[0]}: "
                        "push the model first, without --space")
    if args.space is None or args.model_repo is None:
        raise UserError("--space USER/NAME and --model-repo USER/MODEL go together (--space-requirement with them): the "
                        "Space and the model it serves")
    if args.space_requirement is not None:
        _check_space_requirement(args.space_requirement)
    _check_repo_id(args.space, "--space")
    _check_repo_id(args.model_repo, "--model-repo")
    if args.dry_run is not None:
        out = _check_dry_run_folder(args)
        with user_errors(OSError), write_errors(out), output_folder(out) as staging:
            files = [path.name for path in write_space(staging, args.space, args.model_repo, args.license,
                                                       args.space_requirement)]
        print(f"{len(files)} files of the Space {args.space} written to {out} (nothing was sent):")
        print("\n".join(f"  {name}" for name in files))
        return
    _check_hub_for_push()
    with hub_errors(f"push to the Space {args.space}"):
        commit = push_space(args.space, args.model_repo, private=args.private, license=args.license,
                            requirement=args.space_requirement, token=args.token)
    print(f"pushed to {commit.commit_url}")


def _check_space_requirement(spec: str) -> None:
    """--space-requirement is a pip requirement of this package (`vanilla-transformer[demo] @ git+https://...`)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    try:
        name = canonicalize_name(Requirement(spec).name)
    except InvalidRequirement as error:
        raise UserError(f"--space-requirement {spec!r} is not a pip requirement: {str(error).splitlines()[0]}") \
            from None
    if name != "vanilla-transformer":
        raise UserError(f"--space-requirement {spec!r} installs {name}, not vanilla-transformer: write "
                        "'vanilla-transformer[demo] @ URL' for a URL")


def _check_repo_id(repo_id: str, flag: str = "--repo-id") -> None:
    """`repo_id` is USER/NAME, or NAME alone (the token owner's), as huggingface_hub accepts it."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise UserError(f"{flag} {repo_id!r} is not a Hub repository name: {describe(error)}") from None


def _check_hub_for_push() -> None:
    """The Hub can be reached: one quick request, so that a machine without a network gets one line at once."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        raise UserError("HF_HUB_OFFLINE is set, so nothing can be sent to the Hub: unset it to push, or write the "
                        "folder that would be uploaded with --dry-run OUT")
    if (reason := hub_unreachable()) is not None:
        raise UserError(f"the Hub ({constants.ENDPOINT}) cannot be reached ({reason}); --dry-run OUT writes the "
                        "folder that would be uploaded")


def _check_dry_run_folder(args: argparse.Namespace) -> Path:
    """The folder of --dry-run, checked: a folder (new, empty, or replaced with --force) that holds none of the
    command's inputs nor the current folder."""
    out = Path(args.dry_run)
    if out.exists() and not out.is_dir():
        raise UserError(f"--dry-run {out} is a file, not a folder")
    for name, folder in (("--model", args.model), ("--run", args.run), ("current", ".")):
        if folder is not None and out.resolve() in (Path(folder).resolve(), *Path(folder).resolve().parents):
            raise UserError(f"--dry-run {out} would replace the {name} folder {folder}; choose another")
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise UserError(f"--dry-run {out} is not empty; pass --force to replace what it holds, or choose another")
    check_output_file(str(out / "README.md"), new_folders=True)
    return out


def _dry_run(args: argparse.Namespace, facts: dict) -> None:
    """push --dry-run: the folder `push` would upload, written whole into args.dry_run (a folder beside it, renamed)."""
    from ..hub.push import NoTokenizerError, write_repository
    from ..paths.text_files import output_folder

    out = _check_dry_run_folder(args)
    needed = folder_size(args.model, "model.safetensors", "*.json", "*.py")
    with user_errors(CardFactsError, NoTokenizerError, OSError), write_errors(out, needed), \
            output_folder(out) as staging:
        files = write_repository(args.model, staging, args.repo_id, results=facts, run_dir=args.run,
                                 license=args.license, demo_space=args.demo_space)
        files = [path.relative_to(staging).as_posix() for path in files]
    print(f"{len(files)} files that push would upload to {args.repo_id} written to {out} (nothing was sent):")
    for name in files:
        print(f"  {name}")
