"""A tiny GPT-style byte-level language model, shared by training and serving.

The model is a standard decoder-only transformer (pre-LayerNorm blocks of
causal multi-head self-attention + GELU MLP, learned absolute position
embeddings, output projection tied to the token embedding), in the style of
GPT-2 / nanoGPT, scaled down so it trains in seconds on a CPU.

The tokenizer works on raw UTF-8 bytes (vocabulary of 256), so any prompt can be
encoded and no vocabulary file has to travel with the checkpoint.

Shape conventions used in the docstrings:

* ``B`` -- batch size (sequences),
* ``T`` -- sequence length in tokens, ``T <= block_size``,
* ``C`` -- embedding width ``n_embd``,
* ``V`` -- vocabulary size (256).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import uuid
import warnings
from dataclasses import asdict, dataclass, fields
from typing import Any

# torch warns at import time when numpy is absent; numpy is not needed here.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

#: File name of the training checkpoint inside a checkpoint directory.
CHECKPOINT_FILENAME = "checkpoint.pt"
#: Bumped when the checkpoint layout changes incompatibly.
CHECKPOINT_FORMAT_VERSION = 1
#: fsspec protocols of object stores, where an upload becomes visible whole or not at all (one PUT), so it goes
#: straight to its final name; every other file system gets a temporary name and a rename.
OBJECT_STORE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "memory"})


class ByteTokenizer:
    """Byte-level tokenizer: token id == UTF-8 byte value (vocabulary of 256)."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        """Encode ``text`` to a list of token ids in ``[0, 256)`` (one per UTF-8 byte)."""
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        """Decode token ids back to text; invalid UTF-8 sequences become U+FFFD."""
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


@dataclass
class GPTConfig:
    """Model hyper-parameters (everything needed to rebuild the module)."""

    vocab_size: int = ByteTokenizer.vocab_size
    block_size: int = 128  # maximum context length in tokens
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        """Return a plain dict (safe to store in a ``weights_only`` checkpoint)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GPTConfig":
        """Build a config from :meth:`to_dict` output, ignoring unknown keys."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention with a causal mask."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.resid_drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``x`` of shape ``(B, T, C)`` to ``(B, T, C)``; position t only sees positions <= t."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(self.n_embd, dim=2)
        # (B, T, C) -> (B, n_head, T, head_dim)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward network ``C -> 4C -> C`` with GELU."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``(B, T, C)`` to ``(B, T, C)``."""
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: ``x + attn(ln(x))`` then ``x + mlp(ln(x))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``(B, T, C)`` to ``(B, T, C)``."""
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Decoder-only transformer language model over byte tokens."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # weight tying
        self.apply(self._init_weights)
        # GPT-2 style scaled init of the residual projections.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Number of parameters (tied weights counted once).

        With ``non_embedding=True`` the position embedding is excluded (the token
        embedding is kept because, being tied to ``lm_head``, it does take part
        in a matmul per token), as in nanoGPT's ``get_num_params``.
        """
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.pos_emb.weight.numel()
        return n

    def flops_per_token(self) -> int:
        """Training FLOPs per token (forward + backward), ``6*N + 12*L*C*T``.

        ``N`` = :meth:`num_params` (non-embedding), ``L`` = ``n_layer``,
        ``C`` = ``n_embd`` (= heads x head_dim), ``T`` = ``block_size``. The
        ``6N`` term counts the weight matmuls (2 FLOPs per multiply-add, x3 for
        forward + backward); ``12*L*C*T`` counts the attention score and
        weighted-sum matmuls. Formula from Chowdhery et al. 2022, "PaLM:
        Scaling Language Modeling with Pathways", Appendix B (model FLOPs
        utilization).
        """
        c = self.config
        return 6 * self.num_params() + 12 * c.n_layer * c.n_embd * c.block_size

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the model.

        Args:
            idx: token ids, ``int64`` of shape ``(B, T)`` with ``T <= block_size``.
            targets: optional next-token ids, ``int64`` of shape ``(B, T)``.

        Returns:
            ``(logits, loss)``: logits of shape ``(B, T, V)`` (unnormalised
            log-probabilities), and the mean cross-entropy in nats per token
            (scalar) if ``targets`` was given, else ``None``.
        """
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))
        return logits, loss

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Autoregressively sample ``max_new_tokens`` tokens.

        Args:
            idx: context token ids, ``int64`` of shape ``(B, T0)``, ``T0 >= 1``;
                only the last ``block_size`` tokens are attended to.
            max_new_tokens: number of tokens to append.
            temperature: softmax temperature; ``0`` means greedy (argmax).
            top_k: if set, sample only among the ``top_k`` most likely tokens.
            generator: optional RNG for reproducible sampling.

        Returns:
            ``int64`` tensor of shape ``(B, T0 + max_new_tokens)``.
        """
        for _ in range(max_new_tokens):
            idx_cond = idx[:, -self.config.block_size :]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :].float()  # (B, V)
            if temperature <= 0:
                next_id = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    k = min(top_k, logits.size(-1))
                    kth = torch.topk(logits, k).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = F.softmax(logits, dim=-1)
                next_id = torch.multinomial(probs, num_samples=1, generator=generator)
            idx = torch.cat((idx, next_id), dim=1)
        return idx


def checkpoint_path(checkpoint_dir: str | os.PathLike[str]) -> str:
    """Return ``<checkpoint_dir>/checkpoint.pt``."""
    return os.path.join(os.fspath(checkpoint_dir), CHECKPOINT_FILENAME)


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a checkpoint dict written by ``train_gpt.py`` onto the CPU.

    Uses ``weights_only=True``: the checkpoint holds only tensors, numbers,
    strings, lists and dicts, so no arbitrary code is unpickled.
    """
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    version = ckpt.get("format_version")
    if version != CHECKPOINT_FORMAT_VERSION:
        raise ValueError(
            f"{path}: unsupported checkpoint format_version {version!r} "
            f"(expected {CHECKPOINT_FORMAT_VERSION})"
        )
    return ckpt


def model_from_checkpoint(ckpt: dict[str, Any], device: str | torch.device = "cpu") -> GPT:
    """Rebuild a :class:`GPT` from a checkpoint dict, in eval mode on ``device``."""
    model = GPT(GPTConfig.from_dict(ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval()


class CheckpointStore:
    """A checkpoint directory shared by every cluster, addressed by an fsspec URI (env ``CHECKPOINT_URI``).

    ``file:///mnt/shared/ckpt/...`` and ``memory://...`` work with fsspec
    alone; ``s3://`` needs ``s3fs``, ``gs://`` ``gcsfs``, ``abfs://``/``az://``
    ``adlfs`` in the image, and the store's credentials in the pod's
    environment as those libraries read them. Files keep their names
    (``checkpoint.pt``, ``metrics.json``) under the URI.

    Raises ``ImportError`` (the protocol's library is missing) or
    ``ValueError`` (unknown protocol) on construction; no network I/O happens
    until ``download``/``upload``.
    """

    def __init__(self, uri: str) -> None:
        import fsspec  # a torch dependency; imported here so training without a store does not need it

        self.uri = strip_trailing_slashes(uri)
        # The URI as given: fsspec drops trailing slashes itself, and ``memory:``/``file:`` (a stripped
        # ``memory://``/``file:///``) would be a path relative to the working directory.
        self.fs, self.root = fsspec.core.url_to_fs(uri)
        protocols = {self.fs.protocol} if isinstance(self.fs.protocol, str) else set(self.fs.protocol)
        self.atomic_put = bool(protocols & OBJECT_STORE_PROTOCOLS)

    def url(self, name: str) -> str:
        """The URI of file ``name`` in the store."""
        return f"{self.uri}/{name}"

    def _path(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    def _check_directory(self) -> None:
        """On a file system (not an object store): raise ``NotADirectoryError`` when the store's directory,
        or the nearest of its parents that exists, is a file. fsspec reports that as "not found", which
        would read as an empty store and a fresh start."""
        path = self.root.rstrip("/") or "/"
        while not self.fs.exists(path):
            parent = path.rsplit("/", 1)[0] or "/"
            if parent == path:
                return
            path = parent
        if not self.fs.isdir(path):
            raise NotADirectoryError(f"checkpoint store {self.uri}: {path} is not a directory")

    def download(self, name: str, local_path: str | os.PathLike[str]) -> bool:
        """Copy ``name`` from the store to ``local_path`` atomically (temp file next to it, then ``os.replace``).

        Returns False, leaving ``local_path`` untouched, when the store has no
        ``name`` (or no directory yet). Any other error (network,
        permissions) is raised: starting over instead would later overwrite
        the job's good checkpoint with a worse one.
        """
        local_path = os.fspath(local_path)
        directory = os.path.dirname(os.path.abspath(local_path))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(local_path)}.", suffix=".tmp", dir=directory)
        os.close(fd)
        try:
            try:
                self.fs.get_file(self._path(name), tmp)
            except FileNotFoundError:
                if not self.atomic_put:
                    self._check_directory()
                return False
            os.chmod(tmp, 0o644)
            os.replace(tmp, local_path)
            return True
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def upload(self, local_path: str | os.PathLike[str], name: str) -> None:
        """Copy ``local_path`` to ``name`` in the store so that no reader ever sees part of it.

        Object stores: one PUT to the final name (objects appear whole).
        Other file systems (``file://``, NFS, ...): a hidden temporary name in
        the same directory, then a rename, which replaces the old file
        atomically on POSIX. Raises whatever the file system raises.
        """
        local_path = os.fspath(local_path)
        if self.atomic_put:
            self.fs.put_file(local_path, self._path(name))
            return
        self.fs.makedirs(self.root, exist_ok=True)
        tmp = self._path(f".{name}.{uuid.uuid4().hex}.tmp")
        try:
            self.fs.put_file(local_path, tmp)
            self.fs.mv(tmp, self._path(name))
        except BaseException:
            try:
                self.fs.rm_file(tmp)
            except OSError:
                pass
            raise


    def read_json(self, name: str) -> dict | None:
        """The JSON object stored as ``name``, or None when the store has none (or it is not an object).

        Raises the store's errors other than "not found", and ``ValueError`` for a file that is not JSON.
        """
        try:
            with self.fs.open(self._path(name), "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return None
        value = json.loads(data)
        return value if isinstance(value, dict) else None

    def write_json(self, name: str, value: dict) -> None:
        """Store ``value`` as the JSON file ``name``, whole or not at all (``upload``)."""
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(value, fh)
            self.upload(tmp, name)
        finally:
            os.unlink(tmp)


def strip_trailing_slashes(uri: str) -> str:
    """``uri`` without trailing slashes, but never the ``//`` after its scheme (``memory://`` stays itself:
    ``memory:`` would be a relative local path to fsspec). A plain path may become empty (``/``)."""
    scheme, sep, rest = uri.partition("://")
    if sep:
        return f"{scheme}://{rest.rstrip('/')}"
    return uri.rstrip("/")


def checkpoint_step(path: str | os.PathLike[str]) -> int:
    """The ``step`` of the checkpoint at ``path``, memory-mapped so the tensors are not read."""
    return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["step"])
