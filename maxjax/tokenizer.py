"""Tokenizers for maxjax models, built with Hugging Face ``tokenizers``; chat templates with ``jinja2``.

Two sources are supported:

* a GGUF file's metadata (``Tokenizer.from_gguf``), read with ``gguf.GGUFReader`` (memory-mapped).
  A GGUF carries no ``tokenizer.json``: it stores the vocabulary (``tokenizer.ggml.tokens``), the
  BPE merges (``tokenizer.ggml.merges``), the token types (``tokenizer.ggml.token_type``), the name
  of the pre-tokenizer (``tokenizer.ggml.pre``), the special token ids and the chat template under
  llama.cpp's key names. From those we build the same ``tokenizers.Tokenizer`` that Hugging Face
  transformers builds (``transformers/integrations/gguf/gguf_tokenizer_mapping.py``, formerly
  ``integrations/ggml.py``: ``GGUFGPTConverter`` / ``GGUFLlamaConverter``), with the split regex that
  llama.cpp uses for the ``pre`` name (``src/llama-vocab.cpp``, ``llm_tokenizer_bpe``);
* a ``tokenizer.json`` (``Tokenizer.from_file``) or a Hugging Face model directory with
  ``tokenizer.json`` and ``tokenizer_config.json`` (``Tokenizer.from_pretrained_dir``), as shipped
  with safetensors checkpoints (e.g. all-MiniLM-L6-v2's WordPiece tokenizer).

No tokenization algorithm is written here: BPE, WordPiece, byte-level mapping and decoding are all
the ``tokenizers`` library's. This module only assembles its components from the metadata, and adds
an incremental detokenizer for streaming and a chat-template renderer that follows transformers'
(``transformers/utils/chat_template_utils.py``: an ``ImmutableSandboxedEnvironment`` with
``trim_blocks=True, lstrip_blocks=True``, ``raise_exception``, ``strftime_now``, a ``tojson`` that
does not escape HTML, and ``bos_token``/``eos_token``/... as template variables).

Example::

    tok = Tokenizer.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    ids = tok.encode(prompt)
    stream = tok.incremental_detokenizer()
    for token_id in generated:
        print(stream.add(token_id), end="")
    print(stream.flush())
"""

from __future__ import annotations

import bisect
import datetime
import functools
import itertools
import json
import os
import re
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import tokenizers
from tokenizers import AddedToken, Regex, decoders, pre_tokenizers, processors
from tokenizers.models import BPE

__all__ = [
    "GGUF_PRE_TOKENIZERS",
    "GGUF_TOKENIZER_MODELS",
    "IncrementalDetokenizer",
    "Tokenizer",
    "TokenizerLoadError",
    "bytes_to_unicode",
]


class TokenizerLoadError(ValueError):
    """A tokenizer could not be built: metadata missing or malformed, or a kind we do not support.

    A subclass of ``ValueError``; the message names the file and the key or value at fault.
    """


# llama.cpp's token types (gguf-py ``gguf.TokenType``; ``tokenizer.ggml.token_type``).
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

#: Values of ``tokenizer.ggml.model`` that ``Tokenizer.from_gguf`` can build.
GGUF_TOKENIZER_MODELS = ("gpt2", "llama")

# Token texts that llama.cpp treats as "end of generation" whenever they are in the vocabulary,
# besides the eos/eot/eom ids the metadata names (llama.cpp src/llama-vocab.cpp, ``special_eog_ids``).
EOG_TOKEN_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "<|end_of_text|>",
        "<end_of_utterance>",
    }
)

# llama.cpp also ends generation on the fill-in-the-middle "repo", "file separator" and "pad"
# tokens: the ``tokenizer.ggml.fim_{rep,sep,pad}_token_id`` keys, or else the first token with one
# of these texts (llama-vocab.cpp, "find FIM_REP token" etc.).
FIM_EOG_TOKEN_TEXTS = {
    "fim_rep_token_id": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep_token_id": ("<|file_sep|>",),
    "fim_pad_token_id": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
}

# ---------------------------------------------------------------------------------------------
# Pre-tokenizers for byte-level BPE, by llama.cpp's ``tokenizer.ggml.pre`` name.
#
# llama.cpp (src/llama-vocab.cpp, ``llm_tokenizer_bpe::llm_tokenizer_bpe``) splits text with a list
# of regexes chosen by the ``pre`` name, then maps bytes to GPT-2's printable alphabet. The same
# pipeline in ``tokenizers`` terms:
#
# * "gpt-2": GPT-2's own regex,
#   ``'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)``, which is exactly
#   ``pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)``.
# * "smollm" (also starcoder, refact, command-r, codeshell, exaone, minerva-7b): llama.cpp runs
#   ``\p{N}`` first (every numeric character on its own), then GPT-2's regex. That is
#   ``Sequence([Digits(individual_digits=True), ByteLevel(use_regex=True)])``, which is also what
#   SmolLM's original ``tokenizer.json`` holds (``Digits`` splits on Rust's ``char::is_numeric``,
#   the Unicode N categories, the same set as ``\p{N}``).
# * "llama3", "qwen2", "tekken", "gpt-4o" families: one split regex (isolated) and a ByteLevel with
#   no regex of its own, the regexes as transformers' GGUF converter spells them
#   (``GGUF_PRE_TOKENIZER_SPLITS``), which are llama.cpp's with the case-insensitive group restored.
#
# * "default" (and a file with no ``pre`` key, with a warning, as llama.cpp does): llama.cpp's
#   fallback list, punctuation runs, GPT-2's regex, ``\p{N}+``, ``[0-9][0-9][0-9]``, each splitting
#   the pieces of the one before (that is ``Split(..., "isolated")`` in a ``Sequence``).
#
# transformers' GGUF converter (5.x) has no entry for "smollm" and falls back to GPT-2's regex
# alone. For SmolLM2's vocabulary that gives the same ids on ordinary text, because its merges never
# join a digit to anything (the vocabulary was trained with digits split), but not on numerals
# outside 0-9 after a space (" ½", " ①": transformers "Ġ½", llama.cpp "Ġ" + "½"). We follow
# llama.cpp and the original tokenizer.json; tests/test_tokenizer.py checks the ids against
# llama-cpp-python on every reference string.
# ---------------------------------------------------------------------------------------------

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"

_DEFAULT_SPLITS = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]")

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2_pre() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2_pre() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


def _default_pre() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in _DEFAULT_SPLITS]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )


def _split_then_bytes(regex: str):
    def build() -> pre_tokenizers.PreTokenizer:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )

    return build


#: ``tokenizer.ggml.pre`` names that ``Tokenizer.from_gguf`` knows, mapped to a builder of the
#: ``tokenizers`` pre-tokenizer that reproduces llama.cpp's split for that name. Every one is checked
#: against llama.cpp's tokenizer (llama-cpp-python 0.3.36) with SmolLM2's vocabulary.
GGUF_PRE_TOKENIZERS = {
    "default": _default_pre,
    **dict.fromkeys(("gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion"), _gpt2_pre),
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
        _digits_then_gpt2_pre,
    ),
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "dbrx", "smaug-bpe"),
        _split_then_bytes(_LLAMA3_SPLIT),
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"), _split_then_bytes(_QWEN2_SPLIT)),
    "tekken": _split_then_bytes(_TEKKEN_SPLIT),
    **dict.fromkeys(("gpt-4o", "llama4"), _split_then_bytes(_GPT4O_SPLIT)),
}


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character (the alphabet byte-level BPE vocabularies use).

    Same table as ``openai/gpt-2 encoder.py`` and ``transformers.convert_slow_tokenizer.bytes_to_unicode``;
    ``tokenizers`` applies it internally (``pre_tokenizers.ByteLevel.alphabet()``); we need it only to
    re-spell vocabulary entries that a GGUF stores as raw text rather than in that alphabet.
    """
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


# ---------------------------------------------------------------------------------------------
# GGUF metadata access
# ---------------------------------------------------------------------------------------------

_MISSING = object()


def _open_gguf(path_or_reader: Any) -> tuple[Any, str]:
    """A ``gguf.GGUFReader`` and a name for messages, from a path or an already-open reader."""
    import gguf

    if isinstance(path_or_reader, gguf.GGUFReader):
        reader = path_or_reader
        data = getattr(reader, "data", None)
        name = str(getattr(data, "filename", None) or getattr(reader, "path", None) or "<GGUFReader>")
        return reader, name
    if not isinstance(path_or_reader, (str, os.PathLike)):
        raise TypeError(f"from_gguf expects a path or a gguf.GGUFReader, got {type(path_or_reader).__name__}")
    path = os.fspath(path_or_reader)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file not found: {path}")
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as e:  # gguf raises ValueError / struct errors on a file that is not GGUF
        raise TokenizerLoadError(f"{path}: cannot read as GGUF: {e}") from e
    return reader, path


def _field(reader: Any, key: str, default: Any = _MISSING) -> Any:
    """The decoded value of a metadata key (str, int, bool, float, or a list of those)."""
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    return value


def _required(reader: Any, name: str, key: str) -> Any:
    value = _field(reader, key)
    if value is _MISSING:
        raise TokenizerLoadError(
            f"{name}: no tokenizer metadata: missing GGUF key {key!r} "
            f"(the file must be converted with its vocabulary, e.g. by llama.cpp's convert_hf_to_gguf.py)"
        )
    return value


def _opt_int(reader: Any, key: str) -> int | None:
    value = _field(reader, key, None)
    return None if value is None else int(value)


# ---------------------------------------------------------------------------------------------
# Chat templates (transformers' rendering)
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _compile_chat_template(template: str):
    """Compile ``template`` the way transformers does (``_cached_compile_jinja_template``).

    A ``jinja2.sandbox.ImmutableSandboxedEnvironment`` (chat templates are untrusted code) with
    ``trim_blocks=True, lstrip_blocks=True`` and the ``loopcontrols`` extension; globals
    ``raise_exception(msg)`` (raises ``jinja2.exceptions.TemplateError``), ``strftime_now(fmt)``
    and ``namespace``; a ``tojson`` filter that does not escape HTML; and a ``{% generation %}``
    block tag that renders its body (transformers uses it to track assistant tokens).
    """
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        tags: ClassVar[set[str]] = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)


# ---------------------------------------------------------------------------------------------
# The tokenizer
# ---------------------------------------------------------------------------------------------


def _ids_list(ids: Iterable[Any]) -> list[int]:
    """Token ids as plain Python ints (accepts lists, tuples, numpy and JAX arrays)."""
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if isinstance(ids, int):
        return [ids]
    return [int(i) for i in ids]


class Tokenizer:
    """A text tokenizer: a ``tokenizers.Tokenizer`` plus the special tokens and chat template of a model.

    Build one with ``from_gguf``, ``from_file`` or ``from_pretrained_dir``; or wrap any
    ``tokenizers.Tokenizer`` with the constructor.

    Attributes:
        backend: the ``tokenizers.Tokenizer`` doing the work (padding and truncation disabled).
        bos_token_id, eos_token_id, pad_token_id, unk_token_id: ``int | None``.
        eos_token_ids: ``frozenset[int]``, every id that ends generation. From a GGUF, llama.cpp's
            set: eos, eot, eom, the FIM rep/sep/pad tokens and the tokens named like
            ``<|im_end|>``, ``<|endoftext|>``, ``<|eot_id|>`` (``EOG_TOKEN_TEXTS``); from a directory,
            eos plus ``generation_config.json``'s ``eos_token_id``.
        add_bos_token, add_eos_token: whether ``encode(..., add_special_tokens=True)`` adds them.
        chat_template: ``str | None``, the Jinja chat template.
        special_tokens: ``dict[str, str]``, e.g. ``{"bos_token": "<|im_start|>", ...}``; passed to
            the chat template as variables.
        name: where it was loaded from (used in error messages).
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
        unk_token_id: int | None = None,
        eos_token_ids: Iterable[int] | None = None,
        add_bos_token: bool = False,
        add_eos_token: bool = False,
        chat_template: str | None = None,
        special_tokens: Mapping[str, str] | None = None,
        name: str = "<tokenizer>",
    ):
        self.backend = backend
        self.backend.no_padding()
        self.backend.no_truncation()
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.unk_token_id = unk_token_id
        eos = set(eos_token_ids or ())
        if eos_token_id is not None:
            eos.add(eos_token_id)
        self.eos_token_ids = frozenset(eos)
        self.add_bos_token = bool(add_bos_token)
        self.add_eos_token = bool(add_eos_token)
        self.chat_template = chat_template
        self.name = name
        specials = dict(special_tokens or {})
        for key, tid in (
            ("bos_token", bos_token_id),
            ("eos_token", eos_token_id),
            ("unk_token", unk_token_id),
            ("pad_token", pad_token_id),
        ):
            if key not in specials and tid is not None:
                text = backend.id_to_token(tid)
                if text is not None:
                    specials[key] = text
        self.special_tokens = specials

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, path_or_reader: str | os.PathLike | Any) -> Tokenizer:
        """Build the tokenizer a GGUF file describes in its ``tokenizer.*`` metadata.

        Args:
            path_or_reader: path to a ``.gguf`` file, or an open ``gguf.GGUFReader`` (e.g.
                ``GGUFWeights(...).reader``: parsing the metadata of a 49k-token vocabulary costs
                ``GGUFReader`` a couple of seconds, so share the weights' reader when you have one).

        Keys read: ``tokenizer.ggml.model`` ("gpt2": byte-level BPE; "llama": SentencePiece BPE with
        byte fallback), ``.tokens``, ``.merges`` (required for "gpt2"; for "llama" derived from
        ``.scores`` when absent, as transformers' ``generate_merges`` does), ``.token_type``,
        ``.pre`` (pre-tokenizer name, see ``GGUF_PRE_TOKENIZERS``), ``.bos_token_id``,
        ``.eos_token_id``, ``.eot_token_id``, ``.eom_token_id``, ``.fim_{rep,sep,pad}_token_id``,
        ``.unknown_token_id``, ``.padding_token_id``, ``.add_bos_token``, ``.add_eos_token``,
        ``.add_space_prefix``, ``.scores`` and ``tokenizer.chat_template``.

        Tokens typed CONTROL (3) become added *special* tokens and USER_DEFINED (4) added normal
        tokens, so ``"<|im_start|>"`` in text encodes to its one id (transformers'
        ``add_gguf_special_tokens``). Missing ``add_bos_token`` means False for "gpt2" and True for
        "llama" (llama.cpp's and transformers' default).

        Raises:
            FileNotFoundError: no such file.
            TokenizerLoadError (a ValueError): not a GGUF file; a required key missing (the message
                names the file and the key); an unsupported ``tokenizer.ggml.model`` or
                ``tokenizer.ggml.pre`` (the message lists the supported ones); malformed metadata.
            TypeError: ``path_or_reader`` is neither a path nor a ``GGUFReader``.
        """
        reader, name = _open_gguf(path_or_reader)
        model = _required(reader, name, "tokenizer.ggml.model")
        if model not in GGUF_TOKENIZER_MODELS:
            raise TokenizerLoadError(
                f"{name}: unsupported tokenizer model tokenizer.ggml.model={model!r}; "
                f"supported: {', '.join(GGUF_TOKENIZER_MODELS)}"
            )
        tokens = list(_required(reader, name, "tokenizer.ggml.tokens"))
        n = len(tokens)
        token_type = _field(reader, "tokenizer.ggml.token_type", None)
        token_type = [int(t) for t in token_type] if token_type is not None else [TOKEN_TYPE_NORMAL] * n
        if len(token_type) != n:
            raise TokenizerLoadError(
                f"{name}: tokenizer.ggml.token_type has {len(token_type)} entries, tokenizer.ggml.tokens {n}"
            )
        ids = {
            key: _opt_int(reader, f"tokenizer.ggml.{key}")
            for key in (
                "bos_token_id",
                "eos_token_id",
                "unknown_token_id",
                "padding_token_id",
                "eot_token_id",
                "eom_token_id",
            )
        }
        for key, value in ids.items():
            if value is not None and not 0 <= value < n:
                raise TokenizerLoadError(f"{name}: tokenizer.ggml.{key}={value} is outside the vocabulary (size {n})")
        add_bos = _field(reader, "tokenizer.ggml.add_bos_token", None)
        if add_bos is None:
            add_bos = model == "llama"
        add_eos = bool(_field(reader, "tokenizer.ggml.add_eos_token", False))

        if model == "gpt2":
            backend = _build_byte_level_bpe(reader, name, tokens, token_type)
        else:
            backend = _build_sentencepiece_bpe(reader, name, tokens, token_type, ids["unknown_token_id"])

        _add_special_tokens(backend, tokens, token_type, byte_level=(model == "gpt2"))

        bos, eos = ids["bos_token_id"], ids["eos_token_id"]
        _set_post_processor(backend, tokens, bos if add_bos else None, eos if add_eos else None)

        eog = _end_of_generation_ids(reader, name, tokens, [eos, ids["eot_token_id"], ids["eom_token_id"]])
        chat_template = _field(reader, "tokenizer.chat_template", None)
        return cls(
            backend,
            bos_token_id=bos,
            eos_token_id=eos,
            pad_token_id=ids["padding_token_id"],
            unk_token_id=ids["unknown_token_id"],
            eos_token_ids=eog,
            add_bos_token=bool(add_bos),
            add_eos_token=add_eos,
            chat_template=chat_template,
            name=name,
        )

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike,
        *,
        config: Mapping[str, Any] | None = None,
        chat_template: str | None = None,
        eos_token_ids: Iterable[int] | None = None,
    ) -> Tokenizer:
        """Load a ``tokenizer.json`` (any model ``tokenizers`` can read: BPE, WordPiece, Unigram...).

        Args:
            path: the ``tokenizer.json`` file.
            config: the parsed ``tokenizer_config.json``, if any: special token strings
                (``bos_token``, ``eos_token``, ``pad_token``, ``unk_token``, ``cls_token``,
                ``sep_token``, ``mask_token``, as strings or ``{"content": ...}``),
                ``add_bos_token``/``add_eos_token`` and ``chat_template``.
            chat_template: overrides the config's template.
            eos_token_ids: further ids that end generation (besides ``eos_token``'s).

        Special tokens are added by the file's own post-processor when ``encode`` is called with
        ``add_special_tokens=True`` (e.g. ``[CLS] ... [SEP]`` for BERT). The file's padding and
        truncation settings are disabled (as transformers does unless asked).

        Raises:
            FileNotFoundError: no such file.
            TokenizerLoadError: the file is not a valid ``tokenizer.json``.
        """
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"tokenizer.json not found: {path}")
        try:
            backend = tokenizers.Tokenizer.from_file(path)
        except Exception as e:
            raise TokenizerLoadError(f"{path}: cannot load as a tokenizers tokenizer.json: {e}") from e
        config = dict(config or {})

        specials: dict[str, str] = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token", "cls_token", "sep_token", "mask_token"):
            value = config.get(key)
            if isinstance(value, Mapping):
                value = value.get("content")
            if isinstance(value, str):
                specials[key] = value

        def tid(key: str) -> int | None:
            return backend.token_to_id(specials[key]) if key in specials else None

        template = chat_template if chat_template is not None else config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
            template = named.get("default") or next(iter(named.values()), None)
        return cls(
            backend,
            bos_token_id=tid("bos_token"),
            eos_token_id=tid("eos_token"),
            pad_token_id=tid("pad_token"),
            unk_token_id=tid("unk_token"),
            eos_token_ids=eos_token_ids,
            add_bos_token=bool(config.get("add_bos_token", False)),
            add_eos_token=bool(config.get("add_eos_token", False)),
            chat_template=template,
            special_tokens=specials,
            name=path,
        )

    @classmethod
    def from_pretrained_dir(cls, directory: str | os.PathLike) -> Tokenizer:
        """Load a Hugging Face model directory: ``tokenizer.json`` plus, when present,
        ``tokenizer_config.json`` (special tokens, ``chat_template``), ``special_tokens_map.json``,
        ``chat_template.jinja`` / ``chat_template.json`` (newer layouts of the template) and
        ``generation_config.json`` (its ``eos_token_id``, int or list, joins ``eos_token_ids``).

        Raises:
            FileNotFoundError: the directory or its ``tokenizer.json`` is missing (only fast
                tokenizers, i.e. ``tokenizer.json``, are supported; not ``vocab.txt``/``*.model`` alone).
            TokenizerLoadError: a malformed JSON file.
        """
        directory = os.fspath(directory)
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"not a directory: {directory}")
        tj = os.path.join(directory, "tokenizer.json")
        if not os.path.isfile(tj):
            raise FileNotFoundError(
                f"{directory}: no tokenizer.json (only tokenizer.json-based tokenizers are supported)"
            )

        def load_json(fname: str) -> dict:
            p = os.path.join(directory, fname)
            if not os.path.isfile(p):
                return {}
            try:
                with open(p, encoding="utf-8") as f:
                    return json.load(f)
            except (OSError, ValueError) as e:
                raise TokenizerLoadError(f"{p}: cannot parse JSON: {e}") from e

        config = load_json("special_tokens_map.json")
        config.update(load_json("tokenizer_config.json"))
        jinja_path = os.path.join(directory, "chat_template.jinja")
        if os.path.isfile(jinja_path):
            with open(jinja_path, encoding="utf-8") as f:
                config["chat_template"] = f.read()
        elif "chat_template" not in config:
            ct = load_json("chat_template.json").get("chat_template")
            if ct is not None:
                config["chat_template"] = ct
        gen_eos = load_json("generation_config.json").get("eos_token_id")
        gen_eos = [gen_eos] if isinstance(gen_eos, int) else [int(i) for i in gen_eos or ()]
        tok = cls.from_file(tj, config=config, eos_token_ids=gen_eos)
        tok.name = directory
        return tok

    def save_pretrained(self, directory: str | os.PathLike) -> list[str]:
        """Writes this tokenizer as a Hugging Face tokenizer folder that :meth:`from_pretrained_dir`
        and ``transformers.AutoTokenizer`` read: ``tokenizer.json`` (the ``tokenizers`` model),
        ``tokenizer_config.json`` (special tokens, ``add_bos_token``/``add_eos_token``,
        ``chat_template``) and ``generation_config.json`` (``eos_token_ids`` as ``eos_token_id``).

        Returns the paths written. Existing files of those names are replaced.
        """
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        paths = []
        tj = os.path.join(directory, "tokenizer.json")
        self.backend.save(tj)
        paths.append(tj)
        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": self.add_bos_token,
            "add_eos_token": self.add_eos_token,
            "clean_up_tokenization_spaces": False,
        }
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            if key in self.special_tokens:
                config[key] = self.special_tokens[key]
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        generation: dict[str, Any] = {}
        if self.bos_token_id is not None:
            generation["bos_token_id"] = self.bos_token_id
        if self.eos_token_ids:
            eos = sorted(self.eos_token_ids)
            generation["eos_token_id"] = eos[0] if len(eos) == 1 else eos
        for fname, content in (("tokenizer_config.json", config), ("generation_config.json", generation)):
            path = os.path.join(directory, fname)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(content, f, indent=2, ensure_ascii=False)
            paths.append(path)
        return paths

    # -- basic properties --------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included (the model's embedding rows for a GGUF)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos_token")

    @property
    def pad_token(self) -> str | None:
        return self.special_tokens.get("pad_token")

    @property
    def unk_token(self) -> str | None:
        return self.special_tokens.get("unk_token")

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary entry (in the vocabulary's own spelling), or None."""
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry of an id (byte-level spelling for GPT-2-style BPE), or None."""
        return self.backend.id_to_token(int(token_id))

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str | None]:
        return [self.backend.id_to_token(i) for i in _ids_list(ids)]

    @property
    def all_special_ids(self) -> frozenset[int]:
        """Ids of every added token marked special (what ``skip_special_tokens`` drops)."""
        return frozenset(i for i, t in self.backend.get_added_tokens_decoder().items() if t.special)

    def __repr__(self) -> str:
        return (
            f"Tokenizer(name={self.name!r}, vocab_size={self.vocab_size}, bos={self.bos_token_id}, "
            f"eos={self.eos_token_id}, eos_ids={sorted(self.eos_token_ids)}, add_bos={self.add_bos_token})"
        )

    # -- encode / decode ---------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``. Special tokens written in the text (``"<|im_start|>"``) encode to
        their single ids. With ``add_special_tokens=True`` the model's post-processor adds what the
        model asks for: BOS/EOS for a GGUF only if ``add_bos_token``/``add_eos_token`` (SmolLM2: none),
        ``[CLS]``/``[SEP]`` for BERT.

        Raises:
            TypeError: ``text`` is not a str.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
        """``encode`` of each text (in parallel, by ``tokenizers``); no padding."""
        texts = list(texts)
        for t in texts:
            if not isinstance(t, str):
                raise TypeError(f"encode_batch expects str items, got {type(t).__name__}")
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (list, tuple, numpy or JAX array). Bytes that do not form valid UTF-8
        become U+FFFD. Special tokens are dropped when ``skip_special_tokens``."""
        return self.backend.decode(_ids_list(ids), skip_special_tokens=skip_special_tokens)

    def decode_batch(self, batch: Iterable[Iterable[int]], skip_special_tokens: bool = True) -> list[str]:
        return self.backend.decode_batch([_ids_list(ids) for ids in batch], skip_special_tokens=skip_special_tokens)

    def incremental_detokenizer(
        self, skip_special_tokens: bool = True, prompt_ids: Iterable[int] | None = None
    ) -> IncrementalDetokenizer:
        """A new ``IncrementalDetokenizer`` for streaming generated ids."""
        return IncrementalDetokenizer(self, skip_special_tokens=skip_special_tokens, prompt_ids=prompt_ids)

    def decode_stream(self, ids: Iterable[int], skip_special_tokens: bool = True) -> Iterator[str]:
        """Yield the new text for each id of ``ids`` as it arrives (``""`` while a character is still
        incomplete), then, if the ids ended inside an incomplete character, one last piece with what
        was held back. ``"".join(decode_stream(ids)) == decode(ids)``."""
        detok = self.incremental_detokenizer(skip_special_tokens=skip_special_tokens)
        for token_id in ids:
            yield detok.add(token_id)
        rest = detok.flush()
        if rest:
            yield rest

    # -- chat templates ----------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        *,
        chat_template: str | None = None,
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        **kwargs: Any,
    ) -> str | list[int]:
        """Render a conversation with the model's chat template, as transformers'
        ``apply_chat_template`` does (see ``_compile_chat_template``).

        Args:
            messages: ``[{"role": ..., "content": ...}, ...]``; keys whose value is None are dropped
                (as transformers does).
            add_generation_prompt: append the assistant header so the model answers.
            tokenize: return ``encode(rendered)`` (no BOS/EOS added: the template writes its own).
            chat_template: use this template instead of the model's.
            tools, documents, **kwargs: further template variables.

        Template variables: ``messages``, ``tools``, ``documents``, ``add_generation_prompt``,
        ``bos_token``, ``eos_token``, ``unk_token``, ``pad_token`` (the token strings) and ``kwargs``.

        Raises:
            ValueError: no chat template (the message names the tokenizer's source and where the
                template would be), or ``messages`` is empty.
            TypeError: a message is not a mapping.
            jinja2.exceptions.TemplateError: the template failed or called ``raise_exception``.
        """
        template = chat_template if chat_template is not None else self.chat_template
        if not template:
            raise ValueError(
                f"{self.name}: this tokenizer has no chat template (GGUF key 'tokenizer.chat_template', or "
                f"'chat_template' in tokenizer_config.json / chat_template.jinja); pass chat_template=..."
            )
        if len(messages) == 0:
            raise ValueError("apply_chat_template: the conversation is empty; give at least one message")
        chat = []
        for m in messages:
            if not isinstance(m, Mapping):
                raise TypeError(f"chat messages must be mappings with 'role' and 'content', got {m!r}")
            chat.append({k: v for k, v in m.items() if v is not None})
        variables = {**self.special_tokens, **kwargs}
        rendered = _compile_chat_template(template).render(
            messages=chat,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
        if tokenize:
            return self.encode(rendered, add_special_tokens=False)
        return rendered


class IncrementalDetokenizer:
    """Turns token ids into text one id at a time, for streaming generated output.

    ``add(id)`` returns the text that id completes: ``""`` when the id ends inside a multi-byte
    UTF-8 character (an emoji or CJK character split over byte-level tokens) or is a skipped special
    token; the held-back bytes come out with the id that completes the character. ``flush()`` returns
    whatever is still held back at the end (as ``decode`` would render it, with U+FFFD). The pieces
    joined equal ``tokenizer.decode(all_ids)``.

    The method is the one used by text-generation-inference, vLLM and ``tokenizers.decoders.DecodeStream``:
    decode a short window of ids twice, without and with the new ones, and emit the difference once
    the window's text no longer ends in U+FFFD. Decoding a window with some preceding context (rather
    than each id alone) keeps decoder rules that depend on neighbours (SentencePiece's leading space,
    WordPiece's ``##``) right. Everything is decoded by the tokenizer's own decoder.

    Args:
        tokenizer: a ``Tokenizer`` (or anything with ``decode(ids, skip_special_tokens=...)``).
        skip_special_tokens: as for ``decode``.
        prompt_ids: ids already shown to the user (e.g. the prompt); used only as context for the
            first pieces, never emitted.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True, prompt_ids: Iterable[int] | None = None):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = _ids_list(prompt_ids) if prompt_ids is not None else []
        # ids[prefix_offset:read_offset] is context already emitted; ids[read_offset:] is pending.
        self.read_offset = len(self.ids)
        self.prefix_offset = max(self.read_offset - 6, 0)
        self._emitted: list[str] = []

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int) -> str:
        """Append one id; return the new text it completes (possibly ``""``)."""
        self.ids.append(int(token_id))
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            piece = new_text[len(prefix_text) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self._emitted.append(piece)
            return piece
        return ""

    def add_many(self, ids: Iterable[int]) -> str:
        """``add`` each id; return the concatenated new text."""
        return "".join(self.add(i) for i in _ids_list(ids))

    def flush(self) -> str:
        """Emit what is held back (an incomplete character at the end of the ids, as U+FFFD)."""
        if self.read_offset >= len(self.ids):
            return ""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        piece = new_text[len(prefix_text) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        if piece:
            self._emitted.append(piece)
        return piece

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return "".join(self._emitted)


# ---------------------------------------------------------------------------------------------
# Builders (GGUF -> tokenizers components)
# ---------------------------------------------------------------------------------------------


def _end_of_generation_ids(reader: Any, name: str, tokens: list[str], named: list[int | None]) -> set[int]:
    """llama.cpp's end-of-generation set (``special_eog_ids``): the eos/eot/eom ids, the FIM
    rep/sep/pad tokens (by metadata key, else by text), and every token whose text is one of
    ``EOG_TOKEN_TEXTS``. For SmolLM2: <|endoftext|> (0), <|im_end|> (2) and <reponame> (4)."""
    eog = {i for i in named if i is not None}
    eog.update(i for i, t in enumerate(tokens) if t in EOG_TOKEN_TEXTS)
    wanted = {t for texts in FIM_EOG_TOKEN_TEXTS.values() for t in texts}
    first_by_text = {t: tokens.index(t) for t in wanted.intersection(tokens)}  # the first id of each FIM text present
    for key, texts in FIM_EOG_TOKEN_TEXTS.items():
        tid = _opt_int(reader, f"tokenizer.ggml.{key}")
        if tid is None:
            found = [first_by_text[t] for t in texts if t in first_by_text]
            tid = min(found) if found else None
        if tid is not None and 0 <= tid < len(tokens):
            eog.add(tid)
    return eog


def _outside_byte_alphabet(tokens: list[str], spelling: dict[int, str]) -> set[int]:
    """The indices of the tokens with a character outside GPT-2's byte alphabet (``spelling``'s
    values), found by one regular-expression scan of all tokens joined by newlines (a 128k
    vocabulary in about 30 ms, where a per-token check takes 0.15 s). A newline is itself outside
    the alphabet (byte 10 is spelled ``chr(266)``)."""
    alphabet = "".join(sorted(set(spelling.values())))
    joined = "\n".join(tokens)
    out = set()
    if joined.count("\n") != len(tokens) - 1:  # some tokens hold a newline of their own
        out.update(i for i, t in enumerate(tokens) if "\n" in t)
    matches = [m.start() for m in re.finditer("[^\n" + re.escape(alphabet) + "]", joined)]
    if matches:
        starts = [0, *itertools.accumulate(len(t) + 1 for t in tokens)]  # where token i starts in the joined text
        out.update(bisect.bisect_right(starts, p) - 1 for p in matches)
    return out


def _build_byte_level_bpe(reader: Any, name: str, tokens: list[str], token_type: list[int]) -> tokenizers.Tokenizer:
    """GPT-2-style byte-level BPE, as transformers' ``byte_level_tokenizer`` (GGUFGPTConverter) builds it.

    The vocabulary is the GGUF token list in order (id = position). Entries that are not written in
    GPT-2's byte alphabet (some converters store added tokens as raw text) are re-spelled byte by byte.
    """
    merges_raw = _required(reader, name, "tokenizer.ggml.merges")
    pre_name = _field(reader, "tokenizer.ggml.pre", None)
    if pre_name is None:
        warnings.warn(
            f"{name}: no tokenizer.ggml.pre; using llama.cpp's 'default' pre-tokenizer (its tokens may "
            f"differ from the model's original tokenizer)",
            stacklevel=3,
        )
        pre_name = "default"
    if pre_name not in GGUF_PRE_TOKENIZERS:
        raise TokenizerLoadError(
            f"{name}: unsupported pre-tokenizer tokenizer.ggml.pre={pre_name!r}; supported: "
            f"{', '.join(sorted(GGUF_PRE_TOKENIZERS))}"
        )
    spelling = bytes_to_unicode()
    keys = list(tokens)
    for i in _outside_byte_alphabet(tokens, spelling):
        keys[i] = "".join(spelling[b] for b in tokens[i].encode("utf-8"))
    vocab = dict(zip(reversed(keys), range(len(keys) - 1, -1, -1)))  # a repeated entry keeps its first id
    if len(vocab) != len(tokens):
        warnings.warn(f"{name}: {len(tokens) - len(vocab)} duplicate vocabulary entries", stacklevel=3)
    merges = []
    for m in merges_raw:
        parts = m.split(" ")
        if len(parts) != 2:
            raise TokenizerLoadError(f"{name}: malformed merge {m!r} in tokenizer.ggml.merges (expected 'left right')")
        merges.append((parts[0], parts[1]))
    backend = tokenizers.Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
        )
    )
    backend.pre_tokenizer = GGUF_PRE_TOKENIZERS[pre_name]()
    backend.decoder = decoders.ByteLevel()
    return backend


def _generate_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary and its scores.

    transformers' ``tokenization_utils_base.generate_merges``: every split of a token into two
    vocabulary entries is a merge, ranked by the merged token's score (higher first), ties by piece
    lengths. llama.cpp's SPM tokenizer merges bigrams by the same score.
    """
    merges = []
    for piece, score in scores.items():
        local = []
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                local.append((left, right, score))
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda v: (v[2], len(v[0]), len(v[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _build_sentencepiece_bpe(
    reader: Any, name: str, tokens: list[str], token_type: list[int], unk_id: int | None
) -> tokenizers.Tokenizer:
    """SentencePiece BPE ("llama" in GGUF), as transformers' ``LlamaTokenizer`` (GGUFLlamaConverter) builds it.

    BPE with ``byte_fallback=True`` and ``fuse_unk=True`` (unknown characters become ``<0xNN>``
    byte tokens), merges from ``tokenizer.ggml.merges`` or derived from ``tokenizer.ggml.scores``;
    a ``Metaspace`` pre-tokenizer (``"▁"`` for spaces, prepended to the text when
    ``tokenizer.ggml.add_space_prefix``, default True); decoder Replace("▁", " ") + ByteFallback +
    Fuse (+ Strip of the prepended space).
    """
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)
    merges_raw = _field(reader, "tokenizer.ggml.merges", None)
    if merges_raw is not None:
        merges = [tuple(m.split(" ", 1)) for m in merges_raw]
    else:
        scores_raw = _field(reader, "tokenizer.ggml.scores", None)
        if scores_raw is None:
            raise TokenizerLoadError(
                f"{name}: no tokenizer metadata to build SentencePiece merges: missing GGUF keys "
                f"'tokenizer.ggml.merges' and 'tokenizer.ggml.scores'"
            )
        if len(scores_raw) != len(tokens):
            raise TokenizerLoadError(
                f"{name}: tokenizer.ggml.scores has {len(scores_raw)} entries, tokenizer.ggml.tokens {len(tokens)}"
            )
        scores = {t: float(sc) for t, sc in zip(tokens, scores_raw)}
        merges = _generate_merges(vocab, scores)
    unk_token = tokens[unk_id] if unk_id is not None else None
    backend = tokenizers.Tokenizer(
        BPE(vocab=vocab, merges=merges, unk_token=unk_token, fuse_unk=True, byte_fallback=True, dropout=None)
    )
    add_space_prefix = bool(_field(reader, "tokenizer.ggml.add_space_prefix", True))
    backend.normalizer = None
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first" if add_space_prefix else "never", split=False
    )
    seq = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        seq.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(seq)
    return backend


def _add_special_tokens(
    backend: tokenizers.Tokenizer, tokens: list[str], token_type: list[int], byte_level: bool
) -> None:
    """CONTROL tokens become added special tokens, USER_DEFINED ones added normal tokens (matched
    whole in the text, never split), as transformers' ``add_gguf_special_tokens`` does. They keep
    their vocabulary ids. In a byte-level vocabulary a CONTROL token with characters outside the
    byte alphabet is a mislabel and is skipped (it would get a new id past the model's vocabulary)."""
    alphabet = set(bytes_to_unicode().values()) if byte_level else None
    control = [
        AddedToken(t, special=True, normalized=False)
        for t, tt in zip(tokens, token_type)
        if tt == TOKEN_TYPE_CONTROL and t and (alphabet is None or set(t) <= alphabet)
    ]
    if control:
        backend.add_special_tokens(control)
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, tt in zip(tokens, token_type)
        if tt == TOKEN_TYPE_USER_DEFINED and t and backend.token_to_id(t) is not None
    ]
    if user:
        backend.add_tokens(user)


def _set_post_processor(backend: tokenizers.Tokenizer, tokens: list[str], bos: int | None, eos: int | None) -> None:
    """``add_special_tokens=True`` adds BOS/EOS only when the model asks for them (a TemplateProcessing,
    as transformers' ``LlamaTokenizerFast.update_post_processor``)."""
    if bos is None and eos is None:
        backend.post_processor = None
        return

    def seq(part: str, t: int) -> list[str]:
        out = [f"{tokens[bos]}:{t}"] if bos is not None else []
        out.append(f"${part}:{t}")
        if eos is not None:
            out.append(f"{tokens[eos]}:{t}")
        return out

    single, pair = seq("A", 0), seq("A", 0) + seq("B", 1)
    specials = sorted({(tokens[i], i) for i in (bos, eos) if i is not None}, key=lambda x: x[1])
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
