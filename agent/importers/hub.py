"""Downloading a checkpoint from the Hugging Face Hub (`laplace pull`).

Only the files an import reads are fetched (config, safetensors weights, tokenizer and
template files; `pytorch_model.bin` only where a repo has no safetensors). Downloads go to
`$LAPLACE_HOME/downloads/OWNER__NAME` and resume where they stopped if interrupted.
"""

from __future__ import annotations

from pathlib import Path

from agent.importers.source import CheckpointError

WANTED = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "chat_template.jinja", "*.safetensors", "model.safetensors.index.json"]
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "generation_config.json"]


def download_dir(downloads: Path, repo_id: str) -> Path:
    return downloads / repo_id.replace("/", "__")


def fetch(repo_id: str, dest: Path, *, patterns: list[str] | None = None, revision: str | None = None) -> Path:
    """Download `repo_id`'s files into `dest` (resumable); CheckpointError on any failure."""
    if repo_id.count("/") != 1 or any(not part for part in repo_id.split("/")):
        raise CheckpointError(f"{repo_id!r} is not a repo id; give OWNER/NAME, e.g. cartesia-ai/Llamba-1B")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - a dependency of the package
        raise CheckpointError("huggingface_hub is not installed; pip install huggingface_hub") from None
    dest.mkdir(parents=True, exist_ok=True)
    try:
        snapshot_download(repo_id, revision=revision, local_dir=str(dest), allow_patterns=patterns or WANTED)
        if patterns is None and not any(dest.glob("*.safetensors")):
            snapshot_download(repo_id, revision=revision, local_dir=str(dest), allow_patterns=["pytorch_model.bin"])
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # the hub client raises many kinds (offline, HTTP, gated, not found)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"cannot download {repo_id} ({type(exc).__name__}: {reason[:200]}); check the name and the network "
            "(gated repos need `hf auth login`), or download the files yourself and run `laplace import DIR`"
        ) from None
    return dest
