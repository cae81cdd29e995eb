"""Convert your CS336 assignment-1 TransformerLM (seed 004's "your HW1/HW2 model") into a Hugging
Face Llama directory with a fast tokenizer, which every script here takes as --model.

The handout's model is a pre-norm decoder with RMSNorm, SwiGLU and RoPE, no biases, an untied output
layer: a Llama. The checkpoint is read as students save it: a bare state dict, or a dict holding it
beside optimizer state and an iteration (under "model", "model_state_dict", ... whichever value is a
state dict of tensors; --state-key when several are), with torch.compile's "_orig_mod." and DDP's
"module." prefixes dropped first. Names decide the mapping onto the handout's names
(token_embeddings.weight, layers.{i}.attn.q_proj.weight, ..., ln_final.weight, lm_head.weight):
--key-map's regexes first, then name hints (q/k/v/o/out, w1/w2/w3, gate/up/down, norm1/ln1/pre_attn,
embedding/token, lm_head/output); shapes check every mapped weight; names that decide nothing are
refused in one line listing them. Vocabulary, width, depth and d_ff are read off the shapes; heads,
theta, context length and epsilons are flags with the handout's defaults. The shapes check only that
--num-heads gives even head sizes: compare a logit of the result with your own forward.
The tokenizer is the student's byte-level BPE, as GPT-2's vocab.json + merges.txt, the JSON forms
students write (ids -> token bytes as int lists, latin-1, hex or bytes reprs; token -> id) or a
pickle of (vocab: id -> bytes, merges) read by an unpickler that runs no code. It becomes a
`tokenizers` BPE with GPT-2's pre-tokenizer (the handout's PAT); the special tokens keep their ids.

How the result departs from the handout's model, and why it is still the same function:
- RoPE: the handout rotates adjacent pairs (x0, x1), (x2, x3), ... of each head; HF Llama rotates
  halves (x_i, x_{i + d/2}). Pair i has the same frequency theta^(-2i/d) in both, so reordering each
  head's q_proj and k_proj rows (and biases) as [0, 2, 4, ..., 1, 3, 5, ...] gives the same rotated
  q.k scores (q and k are permuted alike; v and the output projection are not touched).
- SwiGLU: W2(SiLU(W1 x) * W3 x) is Llama's down(SiLU(gate x) * up x): w1 -> gate, w3 -> up,
  w2 -> down.
- A fused QKV weight (3 d_model, d_model) is split into row thirds [q; k; v]. Weights stored
  (d_in, d_out) (an einsum-style Linear) are transposed: the FFN or head shapes show it where they
  are not square, else --transposed / --no-transposed. Attention biases become Llama's
  attention_bias (an absent one zeros), FFN biases its mlp_bias; Llama has no output-layer bias.
- Llama keeps one rms_norm_eps: a --final-norm-eps other than --norm-eps is converted only when it
  moves no logit of a probe batch by more than 1e-4.
- The tokenizer adds no BOS (the handout's model never saw one); the first special token is EOS and
  pad. RoPE buffers (cos/sin tables, inv_freq) and causal-mask buffers a student registered as
  persistent are dropped, with a notice. Without an output layer the model is taken as tied
  (tie_word_embeddings), with a notice.
- Saved in float32. A head size vLLM's CPU engine cannot run is fine: the scripts fall back to
  --engine hf with a notice (rollout.init_engine).

Examples:
  python convert_lm.py --checkpoint ckpt.pt --vocab vocab.json --merges merges.txt \\
      --out models/my-lm
  python convert_lm.py --checkpoint ckpt.pt --vocab tokenizer.pkl --num-heads 16 \\
      --rope-theta 10000 --context-length 256 --key-map names.json --out models/my-lm
  python grpo.py --model models/my-lm --task keyword --train-path keywords.txt \\
      --val-path keywords.txt
"""

import argparse
import ast
import json
import os
import pickle
import re
import shutil

import torch

from common import Parser, attempt, check, existing_file, positive_float, positive_int
from runs import stop
from storage import storage_line, unwritable

# the handout's pre-tokenizer: GPT-2's split, applied between special tokens
PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# handout name (after layers.{i}.) -> HF Llama name (after model.layers.{i}.)
LAYER_NAMES = {
    "attn.q_proj.weight": "self_attn.q_proj.weight",
    "attn.k_proj.weight": "self_attn.k_proj.weight",
    "attn.v_proj.weight": "self_attn.v_proj.weight",
    "attn.output_proj.weight": "self_attn.o_proj.weight",
    "ln1.weight": "input_layernorm.weight",
    "ln2.weight": "post_attention_layernorm.weight",
    "ffn.w1.weight": "mlp.gate_proj.weight",
    "ffn.w3.weight": "mlp.up_proj.weight",
    "ffn.w2.weight": "mlp.down_proj.weight",
}
ATTN_BIASES = {
    "attn.q_proj.bias": "self_attn.q_proj.bias",
    "attn.k_proj.bias": "self_attn.k_proj.bias",
    "attn.v_proj.bias": "self_attn.v_proj.bias",
    "attn.output_proj.bias": "self_attn.o_proj.bias",
}
FFN_BIASES = {
    "ffn.w1.bias": "mlp.gate_proj.bias",
    "ffn.w3.bias": "mlp.up_proj.bias",
    "ffn.w2.bias": "mlp.down_proj.bias",
}
# a name the mapping may produce: the handout's, plus a fused QKV and the biases students add
HANDOUT_NAME = re.compile(
    r"token_embeddings\.weight|ln_final\.weight|lm_head\.(weight|bias)|layers\.\d+\."
    r"(attn\.(q|k|v|qkv|output)_proj\.(weight|bias)|ln[12]\.weight|ffn\.w[123]\.(weight|bias))"
)
# name hints: a token of the module path (split at "." and "_") -> the handout's role
ATTN_ROLES = {
    "q": "q", "wq": "q", "query": "q",
    "k": "k", "wk": "k", "key": "k",
    "v": "v", "wv": "v", "value": "v",
    "o": "output", "wo": "output", "out": "output", "output": "output",
    "qkv": "qkv", "wqkv": "qkv", "in": "qkv",  # in: torch's MultiheadAttention in_proj
}  # fmt: skip
FFN_ROLES = {
    "w1": "w1", "gate": "w1", "1": "w1",
    "w2": "w2", "down": "w2", "2": "w2",
    "w3": "w3", "up": "w3", "3": "w3",
}  # fmt: skip
# the largest logit change a second norm epsilon may cause when Llama keeps one
EPS_TOLERANCE = 1e-4
# what the tokenizer pickle may hold: plain containers, strings, bytes and ints
SAFE_GLOBALS = {
    ("builtins", "dict"),
    ("builtins", "list"),
    ("builtins", "tuple"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "bytes"),
    ("builtins", "bytearray"),
    ("builtins", "str"),
    ("builtins", "int"),
    ("collections", "OrderedDict"),
    ("_codecs", "encode"),  # how protocol 2 pickles bytes: encode(str, "latin1")
}


# ----------------------------------------------------------------------------- config
def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0])
    g = p.add_argument_group("checkpoint")
    g.add_argument(
        "--checkpoint", required=True, type=existing_file, help="torch.save'd state dict"
    )
    g.add_argument(
        "--state-key",
        help="the checkpoint dict's key holding the weights, when several values are state dicts",
    )
    g.add_argument(
        "--key-map",
        type=existing_file,
        help='a JSON object {"regex on your key": "handout name with \\\\1 groups"}, applied '
        "before the name hints",
    )
    g.add_argument(
        "--transposed",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Linear weights stored (d_in, d_out) (--transposed) or nn.Linear's (d_out, d_in) "
        "(--no-transposed); default: read off the FFN or head shapes",
    )
    g.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="unpickle a checkpoint holding more than tensors (a Namespace, numpy values): "
        "runs any code the file holds",
    )
    g = p.add_argument_group("tokenizer")
    g.add_argument(
        "--tokenizer-format",
        default="auto",
        choices=["auto", "gpt2", "pickle", "json"],
        help="gpt2: vocab.json {token: id} and merges.txt in GPT-2's byte-to-unicode strings; "
        "json: the JSON forms students write (ids -> token bytes as int lists, latin-1, hex or "
        "bytes reprs; token -> id), merges as text or reprs; pickle: --vocab FILE holding "
        "(vocab, merges) or {'vocab', 'merges'}, or --vocab and --merges as two pickles; "
        "auto: pickle when the file is one, else json (gpt2's form included)",
    )
    g.add_argument("--vocab", required=True, type=existing_file, help="vocab.json or a pickle")
    g.add_argument("--merges", type=existing_file, help="merges.txt, or the merges pickle")
    g.add_argument(
        "--special-tokens",
        nargs="+",
        default=["<|endoftext|>"],
        help="the special tokens you trained with, each non-empty (an empty one is refused: "
        "'' names no token); the first is EOS",
    )
    g = p.add_argument_group("architecture (not in the checkpoint; the handout's defaults)")
    g.add_argument("--num-heads", type=positive_int, default=16, help="attention heads")
    g.add_argument("--rope-theta", type=positive_float, default=10000.0, help="RoPE's Theta")
    g.add_argument("--context-length", type=positive_int, default=256, help="max positions")
    g.add_argument("--norm-eps", type=positive_float, default=1e-5, help="RMSNorm's epsilon")
    g.add_argument(
        "--final-norm-eps",
        type=positive_float,
        help="the final RMSNorm's epsilon, where it is not --norm-eps",
    )
    g = p.add_argument_group("output")
    g.add_argument("--out", required=True, help="a new (or empty) directory for the HF model")
    return resolve(p.parse_args(argv))


def resolve(args):
    """Checks that need no loading: the file pair the format needs, a usable --out."""
    if args.tokenizer_format == "gpt2":
        check(args.merges is not None, "--tokenizer-format gpt2 needs --merges merges.txt")
    if args.final_norm_eps is None:
        args.final_norm_eps = args.norm_eps
    for s in args.special_tokens:
        check(s != "", "--special-tokens: an empty token ('') names nothing: leave it out")
        check(args.special_tokens.count(s) == 1, f"--special-tokens names {s!r} twice")
    check(
        not os.path.isfile(args.out) and not (os.path.isdir(args.out) and os.listdir(args.out)),
        f"--out {args.out} exists and is not an empty directory: pick a new one",
    )
    problem = unwritable(args.out)
    check(problem is None, f"--out {args.out}: {problem}; choose another --out")
    return args


# ----------------------------------------------------------------------------- tokenizer files
def bytes_to_unicode():
    """GPT-2's printable stand-in for each byte: printable Latin-1 bytes stand for themselves, the
    other 68 map to chr(256), chr(257), ... in byte order. vocab.json and merges.txt use it."""
    keep = list(range(ord("!"), ord("~") + 1))
    keep += list(range(ord("¡"), ord("¬") + 1))
    keep += list(range(ord("®"), ord("ÿ") + 1))
    table = {}
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


GPT2_DECODE = {c: b for b, c in bytes_to_unicode().items()}


def from_gpt2(s):
    return bytes(GPT2_DECODE[c] for c in s)  # KeyError: not in GPT-2's alphabet


def from_repr(s):
    value = ast.literal_eval(s)  # a literal only: no code runs
    if not isinstance(value, bytes):
        raise ValueError("not a bytes literal")
    return value


def from_utf8(s):
    return s.encode("utf-8", "surrogateescape")  # bytes >= 128 alone saved as lone surrogates


# how a student's JSON spells a token's bytes, tried in this order: the first under which every
# token decodes and the 256 single bytes are all there is the file's form
STRING_FORMS = {
    "bytes reprs": from_repr,
    "hex strings": bytes.fromhex,
    "GPT-2 byte-to-unicode strings": from_gpt2,
    "latin-1 strings": lambda s: s.encode("latin-1"),
    "utf-8 strings": from_utf8,
}


def token_bytes(value, form, special_tokens):
    """One token's bytes under a string form; an int list is bytes whatever the form."""
    if isinstance(value, list):
        if not all(isinstance(x, int) and 0 <= x < 256 for x in value):
            raise ValueError("a list that is not byte values")
        return bytes(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if not isinstance(value, str):
        raise ValueError(f"a {type(value).__name__}, not a token")
    if value in special_tokens:
        return value.encode("utf-8")
    try:
        return STRING_FORMS[form](value)
    except (KeyError, SyntaxError, TypeError, ValueError):
        raise ValueError(f"{value!r} is not one of {form}") from None


def id_to_value(table, path):
    """{id: token as stored} of a vocabulary mapping in either orientation ({id: token},
    {str(id): token}, {token: id}) or a list indexed by id; ValueError naming the file."""
    if isinstance(table, list):
        for i, token in enumerate(table):
            byte_list = isinstance(token, list) and all(isinstance(x, int) for x in token)
            if not isinstance(token, (str, bytes)) and not byte_list:
                raise ValueError(
                    f"{path}: entry {i} of the vocabulary list is {str(token)[:40]!r}: a "
                    f"list vocabulary holds id i's token at i (a string, or its bytes as ints)"
                )
        return dict(enumerate(table))
    if not isinstance(table, dict) or not table:
        raise ValueError(f"{path}: expected a vocabulary mapping, got {type(table).__name__}")
    values = list(table.values())
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        out = {}
        for token, i in table.items():
            if i < 0:
                raise ValueError(f"{path}: token {token!r} has id {i}; ids count from 0")
            out[i] = token
        return out
    out = {}
    for i, token in table.items():
        if isinstance(i, str) and i.isdigit():
            i = int(i)
        if not isinstance(i, int) or i < 0:
            raise ValueError(f"{path}: key {i!r} is neither an id nor a token mapped to an id")
        out[i] = token
    return out


def decode_vocab(raw, path, special_tokens, forms):
    """({id: bytes}, the form's name) of {id: stored token}: the first string form (of `forms`)
    under which every token decodes, the entries are distinct and every single byte is a token.
    A token holding U+FFFD was saved lossily (bytes -> str with errors replaced): one line."""
    for i, value in raw.items():
        if isinstance(value, str) and "\ufffd" in value and value not in special_tokens:
            raise ValueError(
                f"{path}: token {i} is {value!r}: U+FFFD means its bytes were lost when it was "
                f"saved as text; re-save the vocabulary as bytes (a pickle, or lists of byte ints)"
            )
    if all(not isinstance(v, str) or v in special_tokens for v in raw.values()):
        forms = ["latin-1 strings"]  # int lists or bytes: no string form to choose
    for form in forms:
        vocab = {}
        try:
            for i, value in raw.items():
                vocab[i] = token_bytes(value, form, special_tokens)
        except ValueError:
            continue
        singles = {b for b in vocab.values() if len(b) == 1}
        if len(set(vocab.values())) == len(vocab) and len(singles) == 256:
            return vocab, form
    raise ValueError(
        f"{path}: no form ({', '.join(forms)}) reads every token as distinct bytes with all 256 "
        f"single bytes: pass --tokenizer-format to say which file this is"
    )


def read_merges_text(path, vocab, special_tokens, form):
    """[(bytes, bytes)] of a merges text file: per line two bytes literals, or two tokens in the
    vocabulary's string form split at the one space that makes both halves and their join tokens
    (a token may hold spaces)."""
    known = set(vocab.values())
    literal = re.compile(r"""b'(?:[^'\\]|\\.)*'|b"(?:[^"\\]|\\.)*\"""")
    forms = [form] + [f for f in STRING_FORMS if f != form]
    merges = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    for n, line in enumerate(lines, 1):
        line = line.rstrip("\r")
        if not line.strip() or (n == 1 and line.startswith("#version")):
            continue
        found = literal.findall(line)
        if len(found) == 2:
            merges.append((from_repr(found[0]), from_repr(found[1])))
            continue
        splits = set()
        spaces = [i for i, c in enumerate(line) if c == " "]
        for at in spaces:
            for form in forms:
                try:
                    a = token_bytes(line[:at], form, special_tokens)
                    b = token_bytes(line[at + 1 :], form, special_tokens)
                except ValueError:
                    continue
                if a in known and b in known and a + b in known:
                    splits.add((a, b))
                    break
        if len(splits) != 1:
            how = "no split of it at a space names" if not splits else "several splits name"
            raise ValueError(f"{path}:{n}: {how} two vocabulary tokens and their merge")
        merges.append(splits.pop())
    return merges


def read_json_tokenizer(vocab_path, merges_path, special_tokens, gpt2_only):
    """(vocab {id: bytes}, merges, a line saying which forms were read) from a JSON vocabulary
    and a merges file (text, or JSON [[a, b], ...])."""
    with open(vocab_path, encoding="utf-8") as f:
        try:
            table = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{vocab_path}: not JSON ({e})") from None
    if merges_path is None:
        raise ValueError(f"{vocab_path} holds no merges: pass --merges merges.txt")
    raw = id_to_value(table, vocab_path)
    forms = list(STRING_FORMS)
    if gpt2_only:
        forms = ["GPT-2 byte-to-unicode strings"]
    vocab, form = decode_vocab(raw, vocab_path, special_tokens, forms)
    vocab_form = form
    if all(not isinstance(v, str) for v in raw.values()):
        form = "byte values"  # the string form read nothing: name what was there
    orientation = "{id: token}"
    if isinstance(table, dict) and isinstance(next(iter(table.values())), int):
        orientation = "{token: id}"
    with open(merges_path, "rb") as f:
        head = f.read(1).decode("latin-1")
    if head in ("[", "{", '"'):  # JSON: a list of pairs, else the wrong shape
        merges = read_merges_json(merges_path, vocab_form, special_tokens)
        merges_form = "a JSON list of pairs"
    else:
        merges = read_merges_text(merges_path, vocab, special_tokens, vocab_form)
        merges_form = "text lines"
    said = f"{vocab_path} as {orientation} with {form}, {merges_path} as {merges_form}"
    return vocab, merges, said


def read_merges_json(path, form, special_tokens):
    """[(bytes, bytes)] of a JSON merges file: a list of [a, b] pairs of tokens in the vocabulary's
    string form (or byte-int lists)."""
    with open(path, encoding="utf-8") as f:
        try:
            pairs = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(pairs, list):
        raise ValueError(
            f"{path}: a JSON {type(pairs).__name__}, expected a list of [a, b] pairs (or "
            f"merges.txt's lines 'a b')"
        )
    return merge_pairs(pairs, path, form, special_tokens)


def merge_pairs(pairs, path, form, special_tokens):
    """[(bytes, bytes)] of a list of two-token pairs; ValueError naming the file and the merge."""
    out = []
    for n, pair in enumerate(pairs):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(f"{path}: merge {n} is {str(pair)[:40]!r}, not a pair of tokens")
        try:
            a = token_bytes(pair[0], form, special_tokens)
            b = token_bytes(pair[1], form, special_tokens)
        except ValueError as e:
            raise ValueError(f"{path}: merge {n}: {e}") from None
        out.append((a, b))
    return out


class NotPlainData(pickle.UnpicklingError):
    """A tokenizer pickle naming a class or function: refused before anything runs."""


class DataOnlyUnpickler(pickle.Unpickler):
    """An unpickler that builds plain data only: a pickle naming any other class or function
    (a Tokenizer object, or code in a __reduce__) is refused before it runs."""

    def find_class(self, module, name):
        if (module, name) in SAFE_GLOBALS:
            return super().find_class(module, name)
        raise NotPlainData(
            f"it pickles {module}.{name}, not plain data: re-save (vocab, merges) as dicts, "
            f"lists, bytes and ints (pickle.dump((tokenizer.vocab, tokenizer.merges), f))"
        )


def read_one_pickle(path):
    try:
        with open(path, "rb") as f:
            return DataOnlyUnpickler(f).load()
    except NotPlainData as e:
        raise ValueError(f"{path}: {e}") from None
    except (
        pickle.UnpicklingError,
        EOFError,
        IndexError,
        ValueError,
        TypeError,
        AttributeError,
        KeyError,
        RecursionError,
        MemoryError,
    ) as e:  # a malformed pickle fails in any of these ways, never by running code
        raise ValueError(f"{path}: not a pickle of plain data ({type(e).__name__})") from None


def read_pickle(vocab_path, merges_path, special_tokens):
    """(vocab, merges, a line saying what was read) from one pickle of both (a tuple or a dict),
    or from two pickles."""
    obj = read_one_pickle(vocab_path)
    if merges_path is not None:
        vocab, merges = obj, read_one_pickle(merges_path)
    elif isinstance(obj, dict) and "vocab" in obj and "merges" in obj:
        vocab, merges = obj["vocab"], obj["merges"]
    elif isinstance(obj, (tuple, list)) and len(obj) == 2:
        vocab, merges = obj
    else:
        raise ValueError(
            f"{vocab_path}: expected (vocab, merges) or {{'vocab', 'merges'}}; "
            f"for a vocab-only pickle pass --merges too"
        )
    raw = id_to_value(vocab, vocab_path)
    vocab, form = decode_vocab(raw, vocab_path, special_tokens, list(STRING_FORMS))
    if not isinstance(merges, (list, tuple)):
        raise ValueError(
            f"{merges_path or vocab_path}: merges are a {type(merges).__name__}, expected a list "
            f"of (bytes, bytes) pairs"
        )
    pairs = merge_pairs(merges, merges_path or vocab_path, form, special_tokens)
    if all(not isinstance(v, str) for v in raw.values()):
        form = "bytes"
    return vocab, pairs, f"{vocab_path} as a pickle of {form}"


def read_tokenizer(fmt, vocab_path, merges_path, special_tokens):
    """(vocab {id: bytes}, merges [(bytes, bytes)]) in --tokenizer-format, with a line saying
    which form was found."""
    if fmt == "auto":
        with open(vocab_path, "rb") as f:
            fmt = "json"
            if f.read(1) == b"\x80":  # pickle protocol 2 and up
                fmt = "pickle"
    if fmt == "pickle":
        vocab, merges, said = read_pickle(vocab_path, merges_path, special_tokens)
    else:
        gpt2_only = fmt == "gpt2"
        vocab, merges, said = read_json_tokenizer(
            vocab_path, merges_path, special_tokens, gpt2_only
        )
    print(f"tokenizer: read {said}: {len(vocab)} tokens, {len(merges)} merges", flush=True)
    return vocab, merges


# ----------------------------------------------------------------------------- tokenizer
def build_tokenizer(vocab, merges, special_tokens, context_length):
    """A transformers fast tokenizer that encodes as the handout's Tokenizer(vocab, merges,
    special_tokens) does: specials split off first, then PAT, then BPE by merge rank. A special
    token missing from vocab gets the next id, as the handout's tokenizer appends it."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    to_char = bytes_to_unicode()
    specials = {s.encode("utf-8"): s for s in special_tokens}
    table = {}  # BPE vocabulary: GPT-2 strings -> id; a special token as its own text
    for i, b in vocab.items():
        if not isinstance(i, int) or not isinstance(b, bytes):
            raise ValueError(f"vocab entry {i!r}: expected an int id and bytes")
        s = specials.get(b) or "".join(to_char[x] for x in b)
        if s in table:
            raise ValueError(f"vocab ids {table[s]} and {i} are both {b!r}")
        table[s] = i
    for s in special_tokens:
        if s not in table:
            table[s] = max(table.values()) + 1
    for b in range(256):
        if to_char[b] not in table:
            raise ValueError(f"vocab has no single-byte token for byte {b}: not a byte-level BPE")
    pairs = []
    for n, (a, b) in enumerate(merges):
        pair = ("".join(to_char[x] for x in a), "".join(to_char[x] for x in b))
        for s in (pair[0], pair[1], pair[0] + pair[1]):
            if s not in table:
                raise ValueError(f"merge {n} {(a, b)!r}: {s!r} is not in the vocabulary")
        pairs.append(pair)
    tok = Tokenizer(models.BPE(vocab=table, merges=pairs, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PAT), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    added = []
    for s in special_tokens:
        added.append(AddedToken(s, special=True, normalized=False))
    tok.add_special_tokens(added)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=special_tokens[0],
        pad_token=special_tokens[0],
        model_max_length=context_length,
    )
    check_round_trip(tokenizer, vocab, special_tokens)
    return tokenizer


def check_round_trip(tokenizer, vocab, special_tokens):
    """Every vocabulary entry is its own id in the built tokenizer and reads back as its bytes:
    a wrong guess of the file's form (latin-1 for utf-8, say) shows here as a moved id."""
    specials = {s.encode("utf-8") for s in special_tokens}
    for i, b in vocab.items():
        token = tokenizer.convert_ids_to_tokens(i)
        if b in specials:
            back = token.encode("utf-8")
        else:
            back = from_gpt2(token)
        if back != b or tokenizer.convert_tokens_to_ids(token) != i:
            raise ValueError(f"vocab id {i} ({b!r}) does not round-trip (it reads back {back!r})")


# ----------------------------------------------------------------------------- checkpoint
def is_state_dict(obj):
    """A non-empty dict of tensors under string names: what module.state_dict() returns."""
    if not isinstance(obj, dict) or not obj:
        return False
    return all(isinstance(k, str) and torch.is_tensor(v) for k, v in obj.items())


def not_a_tensor(obj, where=""):
    """A line naming the first value that is not a tensor in a dict that holds tensors beside
    other values (a state dict with a step count or a list in it), or None."""
    if not isinstance(obj, dict) or not any(torch.is_tensor(v) for v in obj.values()):
        return None
    for name, value in obj.items():
        if not torch.is_tensor(value):
            return (
                f"{where}{name} is not a tensor ({type(value).__name__}): a state dict holds "
                f"tensors only; re-save model.state_dict()"
            )
    return None


def load_checkpoint(path, trust):
    """torch.load with weights_only (no code runs), or in full with --trust-checkpoint."""
    if trust:
        print(
            f"warning: --trust-checkpoint: unpickling {path} in full, which runs any code it holds",
            flush=True,
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=not trust)
    except Exception as e:  # a pickle error or a foreign file: name the file and the cause
        cause = str(e).strip().splitlines()[0]  # torch's own advice runs to many lines
        if "Unsupported global" in str(e):  # weights_only met a class: not a bad file
            raise ValueError(
                "it pickles more than tensors (an argparse Namespace, numpy values, ...), which "
                "torch.load(weights_only=True) refuses: re-save the weights alone "
                "(torch.save(model.state_dict(), 'weights.pt')) or, if you trust the file, "
                "pass --trust-checkpoint"
            ) from None
        raise ValueError(f"cannot read it with torch.load ({type(e).__name__}: {cause})") from None


def find_state_dict(obj, state_key):
    """The checkpoint's weights: the object itself when it is a state dict, else its one value
    that is (save_checkpoint's "model", "model_state_dict", "model_state", ...) or --state-key's,
    with a line saying which key was used."""
    if state_key is not None:
        if not isinstance(obj, dict) or state_key not in obj:
            have = list(obj)[:8] if isinstance(obj, dict) else type(obj).__name__
            raise ValueError(f"--state-key {state_key} is not one of its keys ({have})")
        if not is_state_dict(obj[state_key]):
            bad = not_a_tensor(obj[state_key], f"--state-key {state_key}: ")
            raise ValueError(bad or f"--state-key {state_key} does not hold a dict of tensors")
        return obj[state_key]
    if is_state_dict(obj):
        return obj
    if not isinstance(obj, dict):
        raise ValueError(f"expected a state dict or a dict holding one, got {type(obj).__name__}")
    found = [k for k, v in obj.items() if is_state_dict(v)]
    if len(found) > 1:
        raise ValueError(f"several entries are state dicts ({found}): pass --state-key NAME")
    if not found:
        for key, value in [(None, obj), *obj.items()]:  # a state dict spoiled by one value
            bad = not_a_tensor(value, "" if key is None else f"its {key!r} entry: ")
            if bad:
                raise ValueError(bad)
        raise ValueError(
            f"no entry is a state dict of tensors (keys: {list(obj)[:8]}): save "
            f"model.state_dict(), or pass --state-key NAME"
        )
    others = [str(k) for k in obj if k != found[0]]
    print(f"checkpoint: weights from its {found[0]!r} entry (beside {others})", flush=True)
    return obj[found[0]]


def strip_prefixes(state):
    """Names without torch.compile's "_orig_mod." and DDP's "module." (in any order, repeated),
    before anything reads a name."""
    out = {}
    for name, t in state.items():
        bare = name
        while bare.startswith(("module.", "_orig_mod.")):
            bare = bare.removeprefix("module.").removeprefix("_orig_mod.")
        if bare in out:
            raise ValueError(f"{name} and another key are both {bare} once prefixes are dropped")
        out[bare] = t
    return out


# the words of a RoPE or mask buffer's name (rope.cos_cached, rotary_emb.inv_freq, freqs_cis,
# causal_mask), matched as whole words so a module named "masked_attn" or "processing" is not one
BUFFER_WORDS = {"rope", "rotary", "cos", "sin", "inv", "freq", "freqs", "cis", "mask", "causal"}


def drop_buffers(state):
    """The state dict without the buffers a student registered as persistent: RoPE's (a cos/sin
    table or inv_freq, e.g. layers.0.attn.rope.cos_cached) and a causal mask. Not weights: the
    converted model builds its own from --rope-theta; a one-line notice names them."""
    dropped = []
    for name, t in state.items():
        parts = name.lower().split(".")
        if parts[-1] in ("weight", "bias"):
            continue  # a parameter, whatever its module is called (masked_attn.wq.bias)
        words = set()  # a name's words: "cos_cached" -> cos, cached
        for part in parts:
            words.update(part.split("_"))
        if words & BUFFER_WORDS and (t.is_floating_point() or t.dtype == torch.bool):
            dropped.append(name)
    if dropped:
        print(
            f"notice: dropped {len(dropped)} RoPE or mask buffers ({dropped[0]}, ...): not "
            f"weights; the converted model builds its own from --rope-theta",
            flush=True,
        )
    kept = {}
    for name, t in state.items():
        if name not in dropped:
            kept[name] = t
    return kept


def check_values(state):
    """Every weight a real floating-point tensor of finite values; ValueError naming the first
    that is not (an int or bool tensor would be cast without a word, a NaN or inf would convert
    into a model that generates nothing)."""
    for name, t in state.items():
        if not t.is_floating_point():
            raise ValueError(
                f"{name} is a {t.dtype} tensor, not floating point: save the float weights "
                f"(a quantized or integer checkpoint cannot convert)"
            )
        bad = (~torch.isfinite(t)).sum().item()
        if bad:
            raise ValueError(
                f"{name} holds {bad} non-finite values (NaN or inf) of {t.numel()}: the training "
                f"diverged before this save; convert an earlier checkpoint"
            )


def load_state_dict(path, state_key, trust):
    """The checkpoint's weights, unwrapped, prefixes dropped, buffers dropped, values checked."""
    state = find_state_dict(load_checkpoint(path, trust), state_key)
    state = drop_buffers(strip_prefixes(state))
    check_values(state)
    return state


# ----------------------------------------------------------------------------- names
def read_key_map(path):
    """[(compiled regex, handout name template)] of --key-map's JSON object, in file order."""
    with open(path, encoding="utf-8") as f:
        try:
            table = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"not JSON ({e})") from None
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        raise ValueError('expected one JSON object {"regex on your key": "handout name"}')
    out = []
    for pattern, template in table.items():
        try:
            out.append((re.compile(pattern), template))
        except re.error as e:
            raise ValueError(f"{pattern!r} is not a regex ({e})") from None
    return out


def tokens(segments):
    """The lower-case words of name segments, split at "_" ("w_Q" -> w, q)."""
    out = []
    for segment in segments:
        out.extend(segment.lower().split("_"))
    return out


def guess_name(name, t):
    """The handout name a student's key stands for, from its words, or None when they do not
    decide. Shape says only weight (2-D) or gain (1-D, not named bias); words say which."""
    parts = name.split(".")
    last = tokens(parts[-1:])
    is_bias = "bias" in last or last[0] == "b"  # bias, in_proj_bias, b, b_q
    kind = "bias" if is_bias else "weight"
    layer = next((i for i, p in enumerate(parts) if p.isdigit()), None)
    if layer is None:  # a top-level weight: embeddings, final norm, output layer
        path = name.lower()
        if t.dim() == 1 and not is_bias:
            return "ln_final.weight"
        head = re.search(r"head|out|unemb|logit", path)
        if is_bias and head:
            return "lm_head.bias"
        emb = re.search(r"emb|tok|wte", path)
        if t.dim() == 2 and head and not emb:
            return "lm_head.weight"
        if t.dim() == 2 and emb and not head:
            return "token_embeddings.weight"
        return None
    prefix = f"layers.{parts[layer]}."
    rest = parts[layer + 1 :]
    if t.dim() == 1 and not is_bias:  # a norm's gain: which norm, by its module's words
        path = ".".join(rest).lower()
        if re.search(r"(ln|norm|rms)_?2|post_?att|ffn|ff_|_ff|mlp|feed", path):
            return prefix + "ln2.weight"
        if re.search(r"(ln|norm|rms)_?1|att|input", path):
            return prefix + "ln1.weight"
        return None
    section = None  # the attention or feed-forward module, and the words after it
    after = tokens(rest)
    for i, segment in enumerate(rest):
        if re.search(r"att|mha|msa", segment.lower()):
            section, after = "attn", tokens(rest[i + 1 :])
            break
        if re.search(r"ff|mlp|feed|glu", segment.lower()):
            section, after = "ffn", tokens(rest[i + 1 :])
            break
    roles = set()
    if section in ("attn", None):
        roles |= {"attn." + ATTN_ROLES[w] + "_proj" for w in after if w in ATTN_ROLES}
    if section in ("ffn", None):
        for w in after:
            if w in FFN_ROLES and (section == "ffn" or not w.isdigit()):
                roles.add("ffn." + FFN_ROLES[w])
    if len(roles) != 1:
        return None
    return prefix + roles.pop() + "." + kind


def map_names(state, key_map):
    """The state dict under the handout's names: --key-map's first matching regex, else the name
    hints (guess_name). Refused in one line when names do not decide (listing the keys), when two
    keys take one name, or when the key map writes a name the handout has not. Prints the mapping
    chosen, one line per kind of key (layer indices as {i})."""
    out = {}
    source = {}
    unmatched = []
    for name, t in state.items():
        target = None
        for pattern, template in key_map:
            match = pattern.fullmatch(name)
            if match:
                try:
                    target = match.expand(template)
                except (re.error, IndexError) as e:  # a group the pattern lacks
                    raise ValueError(
                        f"--key-map: {template!r} for {pattern.pattern!r}: {e}"
                    ) from None
                if not HANDOUT_NAME.fullmatch(target):
                    raise ValueError(
                        f"--key-map maps {name} to {target}, which is not a handout name "
                        f"(e.g. layers.0.attn.q_proj.weight, ffn.w1.weight, ln_final.weight)"
                    )
                break
        if target is None and HANDOUT_NAME.fullmatch(name):
            target = name
        if target is None:
            target = guess_name(name, t)
        if target is None:
            unmatched.append(name)
            continue
        if target in out:
            raise ValueError(
                f"{source[target]} and {name} both map to {target}: pass --key-map FILE "
                f'({{"regex on your key": "handout name"}}) to say which is which'
            )
        out[target] = t
        source[target] = name
    if unmatched:
        raise ValueError(
            f"names do not say which handout weight {len(unmatched)} keys are "
            f"({', '.join(unmatched[:6])}{', ...' if len(unmatched) > 6 else ''}): pass --key-map "
            f'FILE, a JSON object {{"regex on your key": "handout name with \\\\1 groups"}}'
        )
    kinds = []
    for target, name in source.items():
        kind = f"{layer_pattern(name)} -> {layer_pattern(target)}"
        if name != target and kind not in kinds:
            kinds.append(kind)
    for kind in kinds:
        print(f"names: {kind}", flush=True)
    return out


def layer_pattern(name):
    """name with its layer index as {i}: one line per kind of key, not per layer."""
    return re.sub(r"(^|\.)\d+(\.|$)", r"\1{i}\2", name, count=1)


# ----------------------------------------------------------------------------- layout
def linear_names(state):
    """The keys of Linear weights (every 2-D one but the embeddings)."""
    return [n for n, t in state.items() if t.dim() == 2 and n != "token_embeddings.weight"]


def orient(state, transposed):
    """Linear weights as nn.Linear's (d_out, d_in). A student's einsum-style Linear stores
    (d_in, d_out): the FFN, fused-QKV or head shapes show which where they are not square
    (d_model is the embeddings' width), else --transposed / --no-transposed must say."""
    if "token_embeddings.weight" not in state:
        raise ValueError("no token embeddings: expected a weight named like token_embeddings")
    shape = tuple(state["token_embeddings.weight"].shape)
    if len(shape) != 2:
        raise ValueError(f"token_embeddings.weight has shape {shape}, expected (vocab, d_model)")
    D = state["token_embeddings.weight"].shape[1]
    votes = {True: 0, False: 0}  # True: stored (d_in, d_out); the majority decides
    for name, t in state.items():
        wide = name.endswith(("ffn.w1.weight", "ffn.w3.weight", "qkv_proj.weight"))
        wide = wide or name == "lm_head.weight"
        if t.dim() != 2 or t.shape[0] == t.shape[1]:
            continue
        rows, cols = t.shape
        if wide and cols == D:
            votes[False] += 1
        elif wide and rows == D:
            votes[True] += 1
        elif name.endswith("ffn.w2.weight") and rows == D:
            votes[False] += 1
        elif name.endswith("ffn.w2.weight") and cols == D:
            votes[True] += 1
    if transposed is None:
        if votes[True] == votes[False]:
            raise ValueError(
                "the shapes cannot tell whether Linear weights are stored (d_out, d_in) or "
                "(d_in, d_out) (d_ff is d_model and the head is tied or square): pass "
                "--no-transposed for nn.Linear's (d_out, d_in), --transposed for (d_in, d_out)"
            )
        transposed = votes[True] > votes[False]
        if transposed:
            print(
                "notice: Linear weights stored (d_in, d_out), as the FFN or head shapes show: "
                "transposed",
                flush=True,
            )
    if not transposed:
        return state
    out = dict(state)
    for name in linear_names(state):
        out[name] = state[name].T
    return out


def split_fused(state):
    """A fused QKV weight (3 d_model, d_model), rows [q; k; v], and its bias as three."""
    out = {}
    for name, t in state.items():
        if ".attn.qkv_proj." not in name:
            out[name] = t
            continue
        if t.shape[0] % 3 != 0:
            raise ValueError(f"{name} has {t.shape[0]} rows: a fused [q; k; v] has 3 d_model")
        q, k, v = t.chunk(3, dim=0)
        for part, value in (("q", q), ("k", k), ("v", v)):
            out[name.replace(".qkv_proj.", f".{part}_proj.")] = value
    return out


def fill_biases(state):
    """(state, attention_bias, mlp_bias): Llama's biases come for all of q/k/v/o (attention)
    or all of gate/up/down (mlp), so an absent one is zeros (o_proj's, typically). Llama's output
    layer has no bias: an all-zero one is dropped, another refused."""
    out = dict(state)
    if "lm_head.bias" in out:
        bias = out.pop("lm_head.bias")
        if bias.abs().max() > 0:
            raise ValueError(
                "the output layer has a bias, which a Llama has not: retrain with bias=False on "
                "lm_head (it cannot be dropped without changing every logit)"
            )
        print("notice: dropped the output layer's bias: all zeros", flush=True)
    layers = sorted({int(n.split(".")[1]) for n in out if n.startswith("layers.")})
    flags = {}
    for what, names in (("attn", ATTN_BIASES), ("ffn", FFN_BIASES)):
        flags[what] = any(n.endswith(tuple(names)) for n in out)
        if not flags[what]:
            continue
        for i in layers:
            for name in names:
                weight = out.get(f"layers.{i}.{name[:-4]}weight")
                key = f"layers.{i}.{name}"
                if key not in out and weight is not None:
                    out[key] = torch.zeros(weight.shape[0], dtype=weight.dtype)
    return out, flags["attn"], flags["ffn"]


def check_shapes(state, num_heads):
    """The sizes the shapes imply {vocab, d_model, layers, d_ff, tied}; ValueError naming the
    first key that is missing, extra or misshapen, or the flag that does not fit."""
    V, D = state["token_embeddings.weight"].shape
    L = 0  # one more than the highest layer index any name has
    for name in state:
        parts = name.split(".")
        if parts[0] == "layers":
            L = max(L, int(parts[1]) + 1)
    if "layers.0.ffn.w1.weight" not in state:
        raise ValueError("no layers.0.ffn.w1.weight: no feed-forward weights were found")
    F = state["layers.0.ffn.w1.weight"].shape[0]
    if D % num_heads != 0 or (D // num_heads) % 2 != 0:
        raise ValueError(
            f"--num-heads {num_heads} does not split d_model {D} into even head sizes: "
            f"pass the --num-heads you trained with"
        )
    want = {"token_embeddings.weight": (V, D), "ln_final.weight": (D,)}
    if "lm_head.weight" in state:  # else tied: the output layer is token_embeddings
        want["lm_head.weight"] = (V, D)
    shapes = {
        "attn.q_proj.weight": (D, D),
        "attn.k_proj.weight": (D, D),
        "attn.v_proj.weight": (D, D),
        "attn.output_proj.weight": (D, D),
        "ln1.weight": (D,),
        "ln2.weight": (D,),
        "ffn.w1.weight": (F, D),
        "ffn.w3.weight": (F, D),
        "ffn.w2.weight": (D, F),
    }
    if any(".attn." in n and n.endswith(".bias") for n in state):
        for name in ATTN_BIASES:
            shapes[name] = (D,)
    if any(".ffn." in n and n.endswith(".bias") for n in state):
        shapes.update({"ffn.w1.bias": (F,), "ffn.w3.bias": (F,), "ffn.w2.bias": (D,)})
    for i in range(L):
        for name, shape in shapes.items():
            want[f"layers.{i}.{name}"] = shape
    for name, shape in want.items():
        if name not in state:
            raise ValueError(f"{name} is missing (expected shape {shape})")
        if tuple(state[name].shape) != shape:
            raise ValueError(
                f"{name} has shape {tuple(state[name].shape)}, expected {shape} "
                f"(d_model {D}, d_ff {F}, vocab {V})"
            )
    extra = sorted(set(state) - set(want))
    if extra:
        raise ValueError(f"{extra[0]} is not a TransformerLM weight ({len(extra)} unexpected)")
    return {"vocab": V, "d_model": D, "layers": L, "d_ff": F, "tied": "lm_head.weight" not in state}


# ----------------------------------------------------------------------------- llama
def rope_halves(w, num_heads):
    """q_proj / k_proj rows (or bias entries) reordered from adjacent-pair RoPE to HF's
    rotate-half: per head, the even rows then the odd ones."""
    d_out = w.shape[0]
    head = d_out // num_heads
    rest = w.shape[1:]  # (d_in,) for a weight, () for a bias
    w = w.reshape(num_heads, head // 2, 2, *rest)  # (H, head/2, pair, ...)
    return w.transpose(1, 2).reshape(d_out, *rest)  # (H, pair, head/2, ...) -> rows


def to_llama(state, num_heads, layers):
    """The handout's state dict under HF Llama's names, q/k rows in rotate-half order, fp32. No
    lm_head.weight (a tied model): the token embeddings are the output layer."""
    out = {
        "model.embed_tokens.weight": state["token_embeddings.weight"],
        "model.norm.weight": state["ln_final.weight"],
        "lm_head.weight": state.get("lm_head.weight", state["token_embeddings.weight"]),
    }
    names = {**LAYER_NAMES, **ATTN_BIASES, **FFN_BIASES}
    for i in range(layers):
        for name, hf_name in names.items():
            w = state.get(f"layers.{i}.{name}")
            if w is None:  # a bias this model has not
                continue
            if name.startswith(("attn.q_proj.", "attn.k_proj.")):
                w = rope_halves(w, num_heads)
            out[f"model.layers.{i}.{hf_name}"] = w
    for name, w in out.items():
        out[name] = w.detach().to(torch.float32).contiguous()
    return out


def read_weights(args):
    """(handout state dict, sizes, attention_bias, mlp_bias) of --checkpoint: unwrapped, names
    mapped, Linear weights oriented, a fused QKV split, biases completed, shapes checked."""
    what = f"--checkpoint {args.checkpoint}"
    key_map = []
    if args.key_map:
        key_map = attempt(read_key_map, args.key_map, what=f"--key-map {args.key_map}")
    state = attempt(
        load_state_dict, args.checkpoint, args.state_key, args.trust_checkpoint, what=what
    )
    state = attempt(map_names, state, key_map, what=what)
    state = attempt(orient, state, args.transposed, what=what)
    state = attempt(split_fused, state, what=what)
    state, attention_bias, mlp_bias = attempt(fill_biases, state, what=what)
    sizes = attempt(check_shapes, state, args.num_heads, what=what)
    if sizes["tied"]:
        print(
            "notice: no output layer (lm_head.weight): a tied model, so the output layer is "
            "token_embeddings.weight (tie_word_embeddings)",
            flush=True,
        )
    return state, sizes, attention_bias, mlp_bias


def final_norm_change(model, final_eps, context_length):
    """The largest logit change on a probe batch (4 x 64 random ids, seeded) from running the
    final RMSNorm at the model's one rms_norm_eps instead of final_eps."""
    gen = torch.Generator().manual_seed(0)
    T = min(64, context_length)
    ids = torch.randint(0, model.config.vocab_size, (4, T), generator=gen)  # (B, T)
    norm = model.model.norm
    saved = norm.variance_epsilon
    with torch.no_grad():
        as_saved = model(ids).logits
        norm.variance_epsilon = final_eps
        as_trained = model(ids).logits
    norm.variance_epsilon = saved
    return (as_saved - as_trained).abs().max().item()


# ----------------------------------------------------------------------------- main
def save(model, tokenizer, args):
    """The model directory written whole or not at all: into a sibling .tmp directory, renamed to
    --out at the end (over an empty --out). A full, read-only or size-limited disk is one line
    (storage.storage_line), and the .tmp directory is removed."""
    out = os.path.abspath(args.out)
    tmp = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.tmp{os.getpid()}")
    try:
        os.makedirs(tmp)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        with open(os.path.join(tmp, "convert_args.json"), "w") as f:
            json.dump(vars(args), f, indent=1)
        os.replace(tmp, out)  # (an empty --out is replaced)
    except BaseException as e:  # a full disk or Ctrl-C: no half-written model stays behind
        line = None
        if isinstance(e, Exception):  # asked before the .tmp directory frees its space
            # no run to resume here: storage.py's line ends "then run it again"
            line = storage_line(e, out, "saving", args.out)
        shutil.rmtree(tmp, ignore_errors=True)
        if line:
            stop(line)
        raise


def main(argv=None):
    args = parse_args(argv)
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab, merges = attempt(
        read_tokenizer,
        args.tokenizer_format,
        args.vocab,
        args.merges,
        args.special_tokens,
        what="--vocab",
    )
    tokenizer = attempt(
        build_tokenizer, vocab, merges, args.special_tokens, args.context_length, what="tokenizer"
    )
    state, sizes, attention_bias, mlp_bias = read_weights(args)
    check(
        len(tokenizer) <= sizes["vocab"],
        f"the tokenizer has {len(tokenizer)} tokens but token_embeddings.weight has "
        f"{sizes['vocab']} rows: pass the tokenizer files (and --special-tokens) you trained with",
    )
    top = max(tokenizer.get_vocab().values())
    check(
        top < sizes["vocab"],
        f"the tokenizer has id {top} but token_embeddings.weight has {sizes['vocab']} rows: pass "
        f"the tokenizer files (and --special-tokens) you trained with",
    )
    eos = tokenizer.eos_token_id
    config = LlamaConfig(
        vocab_size=sizes["vocab"],
        hidden_size=sizes["d_model"],
        intermediate_size=sizes["d_ff"],
        num_hidden_layers=sizes["layers"],
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_heads,
        head_dim=sizes["d_model"] // args.num_heads,
        max_position_embeddings=args.context_length,
        rms_norm_eps=args.norm_eps,
        rope_theta=args.rope_theta,
        hidden_act="silu",
        attention_bias=attention_bias,
        mlp_bias=mlp_bias,
        tie_word_embeddings=sizes["tied"],
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.load_state_dict(to_llama(state, args.num_heads, sizes["layers"]), strict=True)
    if args.final_norm_eps != args.norm_eps:
        change = final_norm_change(model, args.final_norm_eps, args.context_length)
        print(
            f"notice: Llama keeps one rms_norm_eps ({args.norm_eps}, --norm-eps); the final "
            f"norm's --final-norm-eps {args.final_norm_eps} moves the logits of a probe batch "
            f"by at most {change:.1e}",
            flush=True,
        )
        check(
            change <= EPS_TOLERANCE,
            f"--final-norm-eps {args.final_norm_eps} against --norm-eps {args.norm_eps} changes "
            f"logits by {change:.1e} (over {EPS_TOLERANCE}): a Llama cannot hold both; check "
            f"--final-norm-eps",
        )
    save(model, tokenizer, args)
    print(
        f"converted {args.checkpoint}: vocab {sizes['vocab']}, d_model {sizes['d_model']}, "
        f"{sizes['layers']} layers, {args.num_heads} heads (head size "
        f"{sizes['d_model'] // args.num_heads}), d_ff {sizes['d_ff']}, context "
        f"{args.context_length}, attention bias {attention_bias}, mlp bias {mlp_bias}, "
        f"tokenizer {len(tokenizer)} tokens (EOS {eos}) -> {args.out}"
    )
    return args.out


if __name__ == "__main__":
    main()
