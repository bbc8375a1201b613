"""Publishing a model folder to the Hugging Face Hub (`--push_to_hub REPO_ID`), private by default.

Two calls, so that nothing is lost and nothing waits hours to fail:
    check_ready   before training: a token, online mode, the Hub reachable and the token accepted
                  (one small request); any failure stops the run at once with what to do
    push_folder   after the final save: creates the repository (private unless asked) and uploads the
                  folder; a failure (the network went away, the quota) leaves the saved folder as it is
                  and says the one command that uploads it later

huggingface_hub comes with transformers. Its transport errors (httpx) are not OSErrors, so they are
named here from the library itself.
"""

from __future__ import annotations

import os
from pathlib import Path

from finetune.system.errors import ToolError


class HubError(ToolError):
    """Publishing cannot happen; the message says why and what to do."""


def upload_command(folder: Path, repo_id: str, private: bool) -> str:
    return f"hf upload {repo_id} {folder} . --repo-type model" + (" --private" if private else "")


def _transport_errors() -> tuple[type[BaseException], ...]:
    from huggingface_hub import errors

    return (OSError, errors.HfHubHTTPError, getattr(errors, "HTTPError", OSError))


def check_ready(repo_id: str) -> str:
    """Raise HubError unless an upload to `repo_id` can start: a valid id, online mode, a token the Hub
    accepts. Returns the account name."""
    import huggingface_hub
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except ValueError as error:
        raise HubError(f"--push_to_hub {repo_id}: not a repository id ({error}); use NAME or OWNER/NAME") from error
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        raise HubError(
            "--push_to_hub: HF_HUB_OFFLINE is set, so nothing can be uploaded; unset it, or train "
            "without --push_to_hub and upload the folder later with `hf upload`"
        )
    token = huggingface_hub.get_token()
    if not token:
        raise HubError(
            "--push_to_hub: no Hugging Face token: run `hf auth login` (or set HF_TOKEN to a token with "
            "write access), or train without --push_to_hub and upload later"
        )
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        account = huggingface_hub.HfApi().whoami(token=token)
    except _transport_errors() as error:
        raise HubError(
            f"--push_to_hub: the Hub at {endpoint} cannot be reached or refused the token ({error}); "
            "check the network and the token, or train without --push_to_hub and upload later"
        ) from error
    return str(account.get("name", "?"))


def push_folder(folder: Path, repo_id: str, private: bool = True) -> str:
    """Create `repo_id` (private unless `private` is False; an existing one is reused) and upload
    `folder` into it. Returns the repository's URL; raises HubError (the folder untouched) on failure."""
    import huggingface_hub

    api = huggingface_hub.HfApi()
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(
            folder_path=str(folder),
            repo_id=repo_id,
            repo_type="model",
            commit_message="Upload a voice trained with train_vits.py",
        )
    except _transport_errors() as error:
        raise HubError(
            f"could not upload {folder} to {repo_id} ({error}); the folder is saved as it was: upload it "
            f"later with `{upload_command(folder, repo_id, private)}`"
        ) from error
    return str(url)
