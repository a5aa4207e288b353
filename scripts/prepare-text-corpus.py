#!/usr/bin/python3
"""Prepares a text corpus for examples/gpt's --data: SentencePiece tokens in .npy shards.

    scripts/prepare-text-corpus.py OUT [--source DIR] [--glob PATTERN] [--vocab-size 4096]

The documents are the files under --source matching --glob (default: the reStructuredText sources
of Python 3.11's documentation, Debian's python3.11-doc), read as UTF-8 in sorted order. Every
--val-every'th document (the 20th, 40th, ...) is held out for validation; the split is by document,
so no text of a validation document is trained on. A SentencePiece BPE model is trained on the
training documents only, with byte fallback (a character it has no piece for is written as its
UTF-8 bytes, so every text encodes and decodes back exactly). Each split's documents are encoded
and packed into one stream with the end-of-sequence id between two documents, cut into
OUT/train-00000.npy, ... and OUT/val-00000.npy, ... (1-D uint16 arrays of --shard-tokens tokens, the
last shorter). OUT/tokenizer.model is the SentencePiece model and OUT/meta.json says what the
shards hold: the vocabulary size, the separator id, and per split the documents, tokens and UTF-8
bytes (val/bpb = val/loss * tokens / (bytes * ln 2)), and the source with its package version.

The same input gives the same files, byte for byte (SentencePiece trains on one thread).
Needs Debian's python3-sentencepiece and python3-numpy (scripts/setup.sh installs them).
"""
import argparse
import hashlib
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import sentencepiece as spm

DEFAULT_SOURCE = "/usr/share/doc/python3.11/html/_sources"


def documents(source, pattern):
    """The (relative path, text) of every file under `source` matching `pattern`, sorted by path."""
    paths = sorted(p for p in Path(source).glob(pattern) if p.is_file())
    if not paths:
        sys.exit(f"prepare-text-corpus: no files match {pattern!r} under {source}. HINT: install Debian's "
                 f"python3.11-doc (scripts/setup.sh) or pass --source DIR --glob PATTERN.")
    return [(str(p.relative_to(source)), p.read_text(encoding="utf-8")) for p in paths]


def package_of(source):
    """The Debian package that installed `source` and its version, or (None, None)."""
    try:
        owner = subprocess.run(["dpkg-query", "-S", str(source)], capture_output=True, text=True, check=True)
        package = owner.stdout.split(":")[0].split(",")[0].strip()
        version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True,
                                 check=True).stdout.strip()
        return package, version
    except (OSError, subprocess.CalledProcessError):
        return None, None


def train_tokenizer(train_docs, out, vocab_size):
    """Trains OUT/tokenizer.model on the lines of the training documents."""
    # From an iterator into memory: a model trained from a file records the file's path.
    lines = (line for _, text in train_docs for line in text.splitlines() if line.strip())
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=lines, model_writer=model, model_type="bpe", vocab_size=vocab_size,
        # Every character of the training text gets a piece; a character it never saw falls
        # back to its UTF-8 bytes (256 reserved pieces), so any text round-trips.
        character_coverage=1.0, byte_fallback=True,
        # The text as it is: no NFKC, whitespace kept (indentation is structure in reST and
        # code), newlines fall back to the byte <0x0A>, no space invented before a document.
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=False,
        allow_whitespace_only_pieces=True, split_digits=True,
        # No <s> (the stream needs only a separator); </s> separates documents.
        unk_id=0, eos_id=1, bos_id=-1, pad_id=-1,
        # One thread and every sentence: the same model each time.
        num_threads=1, input_sentence_size=0, shuffle_input_sentence=False,
        max_sentence_length=16384, minloglevel=2)
    (out / "tokenizer.model").write_bytes(model.getvalue())


def write_split(name, docs, processor, out, shard_tokens, dtype):
    """Encodes `docs`, packs them with the separator between two documents, and writes the
    shards OUT/<name>-00000.npy, ...; returns the split's counts for meta.json."""
    separator = processor.eos_id()
    ids = []
    for i, (_, text) in enumerate(docs):
        if i:
            ids.append(separator)
        ids.extend(processor.encode(text))
    stream = np.asarray(ids, dtype=dtype)
    files = []
    for first in range(0, len(stream), shard_tokens):
        path = out / f"{name}-{len(files):05d}.npy"
        np.save(path, stream[first:first + shard_tokens])
        files.append(path.name)
    return {"documents": len(docs), "tokens": int(len(stream)),
            "bytes": sum(len(text.encode("utf-8")) for _, text in docs), "files": files,
            "first_documents": [path for path, _ in docs[:3]]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the folder to write (created; its old shards are replaced)")
    parser.add_argument("--source", type=Path, default=Path(DEFAULT_SOURCE), help="the folder of the documents")
    parser.add_argument("--glob", default="**/*.rst.txt", help="which files under --source are documents")
    parser.add_argument("--vocab-size", type=int, default=4096, help="SentencePiece pieces, bytes included")
    parser.add_argument("--val-every", type=int, default=20,
                        help="hold out every Nth document (in sorted order) for validation")
    parser.add_argument("--shard-tokens", type=int, default=1 << 20, help="tokens per .npy file")
    args = parser.parse_args()
    if args.val_every < 2:
        sys.exit(f"prepare-text-corpus: --val-every={args.val_every} leaves nothing to train on. HINT: 20 holds out "
                 f"every 20th document (5%).")

    docs = documents(args.source, args.glob)
    train = [d for i, d in enumerate(docs) if (i + 1) % args.val_every != 0]
    val = [d for i, d in enumerate(docs) if (i + 1) % args.val_every == 0]
    if not val:
        sys.exit(f"prepare-text-corpus: {len(docs)} documents hold no validation document with --val-every "
                 f"{args.val_every}. HINT: pass a smaller --val-every or more documents.")
    args.out.mkdir(parents=True, exist_ok=True)
    for old in list(args.out.glob("train-*.npy")) + list(args.out.glob("val-*.npy")):
        old.unlink()

    train_tokenizer(train, args.out, args.vocab_size)
    processor = spm.SentencePieceProcessor(model_file=str(args.out / "tokenizer.model"))
    dtype = np.uint16 if processor.get_piece_size() <= 1 << 16 else np.int32
    splits = {name: write_split(name, split, processor, args.out, args.shard_tokens, dtype)
              for name, split in (("train", train), ("val", val))}
    package, version = package_of(args.source)
    meta = {
        "vocab_size": processor.get_piece_size(),
        "separator_id": processor.eos_id(),
        "dtype": np.dtype(dtype).name,
        "tokenizer": "tokenizer.model",
        "tokenizer_type": "sentencepiece bpe, byte fallback",
        "tokenizer_sha256": hashlib.sha256((args.out / "tokenizer.model").read_bytes()).hexdigest(),
        "sentencepiece_version": spm.__version__,
        "split": f"every {args.val_every}th document (sorted by path) validates",
        "source": {"path": str(args.source), "glob": args.glob, "package": package, "version": version},
        "splits": splits,
    }
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    for name, s in splits.items():
        print(f"{name}: {s['documents']} documents, {s['bytes']} bytes -> {s['tokens']} tokens "
              f"({s['bytes'] / max(s['tokens'], 1):.2f} bytes/token) in {len(s['files'])} files")
    print(f"wrote {args.out} (vocabulary {meta['vocab_size']}, separator {meta['separator_id']})")


if __name__ == "__main__":
    main()
