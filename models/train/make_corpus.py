"""Assembles the training corpus of models/dcformer-kjv from Debian's bible-kjv packages.

Source: the King James Version of the Bible (1611) as Debian's `bible-kjv-text` ships it,
read with the `bible` program of package `bible-kjv`. The translation's copyright has
expired: /usr/share/doc/bible-kjv-text/copyright says "The copyright for the King James
Version text of the Bible is expired since the translation was done in 1611", and the data
file itself is provided "for unrestricted use". Nothing is downloaded.

One document per chapter (1,189), one verse per line, without references. Chapters whose
index in canonical order is congruent to HELDOUT_OFFSET modulo HELDOUT_EVERY are the held-out
split (30 chapters spread over the whole book); the rest is the training split.

Writes OUT/corpus.json: {"source": ..., "train": [doc, ...], "heldout": [doc, ...]} and
OUT/train.txt (training documents, one per line group) for the tokenizer trainer.

    /usr/bin/python3 models/train/make_corpus.py --out models/train/data
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

HELDOUT_EVERY = 40
HELDOUT_OFFSET = 20
BIBLE_RANGE = "Gen1:1-Rev22:21"
# "Ge1:1 In the beginning..." / "1Sam3:4 That the LORD called..."
VERSE_RE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")


def read_verses():
    """(book, chapter, text) of every verse, in canonical order."""
    if shutil.which("bible") is None:
        sys.exit("make_corpus: the `bible` program is missing: apt-get install bible-kjv")
    out = subprocess.run(["bible", "-f", BIBLE_RANGE], check=True, capture_output=True,
                         text=True, encoding="ascii").stdout
    verses = []
    for n, line in enumerate(out.splitlines(), 1):
        m = VERSE_RE.match(line)
        if m is None:
            sys.exit(f"make_corpus: line {n} of `bible -f` output is not a verse: {line!r}")
        book, chapter, _, text = m.groups()
        verses.append((book, int(chapter), " ".join(text.split())))
    return verses


def chapters(verses):
    docs, key, lines = [], None, []
    for book, chapter, text in verses:
        if (book, chapter) != key and lines:
            docs.append("\n".join(lines))
            lines = []
        key = (book, chapter)
        lines.append(text)
    docs.append("\n".join(lines))
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory")
    args = ap.parse_args()
    verses = read_verses()
    docs = chapters(verses)
    if len(verses) != 31102 or len(docs) != 1189:
        sys.exit(f"make_corpus: expected 31102 verses in 1189 chapters, got {len(verses)} "
                 f"in {len(docs)}")
    train = [d for i, d in enumerate(docs) if i % HELDOUT_EVERY != HELDOUT_OFFSET]
    heldout = [d for i, d in enumerate(docs) if i % HELDOUT_EVERY == HELDOUT_OFFSET]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "corpus.json"), "w") as f:
        json.dump({"source": "King James Version (1611), Debian package bible-kjv-text",
                   "train": train, "heldout": heldout}, f)
    with open(os.path.join(args.out, "train.txt"), "w") as f:
        f.write("\n".join(train) + "\n")
    chars = sum(map(len, train)), sum(map(len, heldout))
    print(f"make_corpus: {len(train)} training chapters ({chars[0]} chars), "
          f"{len(heldout)} held-out chapters ({chars[1]} chars) -> {args.out}")


if __name__ == "__main__":
    main()
