"""Whether the Hub can be reached, asked once and quickly before anything is fetched from or sent to it: a machine
without a network is a fact to report in one line, not a traceback or a minute of retries. `check_model` takes a
command's model, a folder here or a Hub id, on that basis."""

import json
import re
import threading
from pathlib import Path

from ..errors import UserError, describe
from ..paths.folders import looks_local, no_such_folder
from ..paths.model_folders import TOKENIZER_FILES, ModelFolderError, check_model_folder

# A model on the Hub: USER/NAME (huggingface_hub checks the details when it is fetched).
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# The Hub's answer must come quickly: beyond this, the command stops instead of waiting on the network.
HUB_PROBE_TIMEOUT = 5.0


class ModelNotFoundError(UserError):
    """A model (`value`: a folder or a Hub id) that is neither a folder here nor a Hub model that can be fetched now;
    the message says which and why."""

    def __init__(self, value: str, message: str):
        super().__init__(message)
        self.value = value


def check_model(
    value: str, *, config: bool = True, weights: bool = True, tokenizer: bool = True, hub: bool = True
) -> str:
    """`value` if it is a folder with the files asked for (`config.json`, weights, tokenizer files) or, with `hub`, a
    Hub id USER/NAME that can be fetched; otherwise a `ModelNotFoundError` or a `ModelFolderError` naming what is
    wrong. Checked before loading, so that
    a mistyped path is never sent to the Hub as a repository name.

    A value is a path, never a Hub id, when it has more parts than USER/NAME, or its first part is a folder here or a
    close misspelling of one (`ouputs/model`: "did you mean outputs/model?"). A Hub id is fetched only when the Hub
    answers one quick request ([`hub_unreachable`]), or, in offline mode (`HF_HUB_OFFLINE=1`), when the cache holds
    it: a machine without a network gets one line at once instead of a minute of huggingface_hub's retries."""
    folder = Path(value)
    if folder.is_dir():
        check_model_folder(value, config=config, weights=weights, tokenizer=tokenizer)
        if config:
            check_config_values(folder)
        return value
    if folder.exists():
        raise ModelNotFoundError(value, f"{value} is a file, not a folder")
    if hub and HUB_ID.fullmatch(value) and not looks_local(value):
        _check_hub_model(value)
        return value
    raise ModelNotFoundError(value, no_such_folder(value, hub_hint=hub))


def check_config_values(folder: Path) -> None:
    """A `ModelFolderError` naming the folder's config.json and the field, when the configuration of this package's
    model that it holds cannot build one (a field of the wrong type, a size out of range). A folder of another model is
    left to transformers."""
    from huggingface_hub.errors import StrictDataclassError

    from ..model.configuration_vanilla_transformer import VanillaTransformerConfig

    path = folder / "config.json"
    values = json.loads(path.read_text(encoding="utf-8"))  # whole JSON: check_model_folder read it
    if not isinstance(values, dict):
        raise ModelFolderError(folder, f"{path} holds no configuration (a JSON object)")
    if values.get("model_type") != VanillaTransformerConfig.model_type:
        return
    try:
        VanillaTransformerConfig.from_dict(values)
    except (StrictDataclassError, ValueError, TypeError) as error:
        # A strict field's error says which field; the cause under it, what is wrong with its value.
        raise ModelFolderError(folder, f"{path}: {describe(error.__cause__ or error)}") from error


def _check_hub_model(repo_id: str) -> None:
    """A `ModelNotFoundError` unless the Hub id `repo_id` is valid and can be fetched now: from the Hub, or offline
    from the cache."""
    from huggingface_hub import constants
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise ModelNotFoundError(repo_id, f"no such folder: {repo_id}, nor a valid Hub id: {describe(error)}") from None
    if constants.is_offline_mode():
        if not in_cache(repo_id):
            raise ModelNotFoundError(repo_id, f"{repo_id} is no folder here, nor a model in the Hub cache "
                                              "(HF_HUB_OFFLINE is set)")
    elif (reason := hub_unreachable()) is not None:
        cached = "it is in the cache, which" if in_cache(repo_id) else "a model already in the cache"
        raise ModelNotFoundError(
            repo_id, f"{repo_id} is no folder here, and the Hub ({constants.ENDPOINT}) cannot be reached to fetch it "
            f"as a model ({reason}); {cached} loads with HF_HUB_OFFLINE=1"
        )


def hub_unreachable(timeout: float = HUB_PROBE_TIMEOUT) -> str | None:
    """Why the Hub cannot be reached, or None when it answers, or when huggingface_hub is in offline mode (it then
    answers from its cache at once, or says it cannot).

    One HEAD request of the endpoint through huggingface_hub's own session (its proxies, certificates and
    `HF_ENDPOINT`), without the retries of its downloads (five, about a minute on a machine without a network). Any
    HTTP answer, an error status included, means the Hub can be reached. It runs in a thread waited on for
    `timeout` seconds, since a name lookup that hangs is not bounded by the HTTP library's own timeout."""
    from huggingface_hub import constants, get_session

    if constants.is_offline_mode():
        return None
    outcome = {}

    def probe():
        try:
            get_session().head(constants.ENDPOINT, timeout=timeout)
        # Any failure of the request means no answer. The exception classes are those of the HTTP library that
        # huggingface_hub chose (httpx2 today, which are not OSErrors; requests before): none is named here.
        except Exception as error:
            outcome["reason"] = network_reason(error)

    thread = threading.Thread(target=probe, name="hub-probe", daemon=True)
    thread.start()
    thread.join(timeout + 1)
    if thread.is_alive():
        return f"no answer in {timeout:g} s"
    return outcome.get("reason")


def network_reason(error: BaseException) -> str:
    """A network error's message without its errno: "Name or service not known"."""
    return re.sub(r"^\[Errno -?\d+\]\s*", "", " ".join(str(error).split())) or type(error).__name__


def in_cache(repo_id: str) -> bool:
    """Whether huggingface_hub's cache holds files of the Hub model `repo_id` (its config or tokenizer)."""
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(repo_id, name), str) for name in ("config.json", *TOKENIZER_FILES))


def is_network_error(error: BaseException) -> bool:
    """Whether `error` is the network failing (a dropped connection, a timeout), as Python or as the HTTP library that
    huggingface_hub uses raises it; that library is found from huggingface_hub's session, not named (its exception
    classes are no OSErrors)."""
    from huggingface_hub import get_session

    library = type(get_session()).__module__.split(".")[0]
    return isinstance(error, (ConnectionError, TimeoutError)) or type(error).__module__.split(".")[0] == library


__all__ = [
    "ModelNotFoundError",
    "check_config_values",
    "check_model",
    "hub_unreachable",
    "in_cache",
    "is_network_error",
    "network_reason",
]
