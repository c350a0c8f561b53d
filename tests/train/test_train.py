"""models/train/train.py's training windows: the default run's are the random windows of the
stream it always drew (--copy-fraction 0 feeds the model what it fed before the option), and
--copy-fraction turns that fraction of them into a passage followed by itself again, from a
line start, without moving the ordinary windows. A synthetic stream; no corpus needed.
Run with /usr/bin/python3 (Debian's python3-torch).
"""

import os
import sys
import unittest

import torch

SOURCE_DIR = os.environ.get(
    "DCF_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
sys.path.insert(0, os.path.join(SOURCE_DIR, "models", "train"))
import train  # noqa: E402


def stream(n=20000, seed=7):
    """Random ids with a newline roughly every 25 tokens and an EOS every ~2,000."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(12, 4096, (n,), generator=gen)
    ids[torch.rand(n, generator=gen) < 0.04] = train.NEWLINE_ID
    ids[torch.rand(n, generator=gen) < 0.0005] = train.MODEL["eos_token_id"]
    return ids


def is_copy_window(x, y):
    """The length n of the passage x repeats, or None."""
    full = torch.cat([x, y[-1:]])
    for n in range(train.COPY_MIN_LEN, train.COPY_MAX_LEN + 1):
        if torch.equal(full[n:], full[:-n]):
            return n
    return None


class WindowsTest(unittest.TestCase):
    def test_default_windows_are_the_original_draws(self):
        # The loop before --copy-fraction, verbatim: one randint of the batch's starts from
        # the seeded generator, x and y sliced from them.
        ids = stream()
        want_gen, got_gen = (torch.Generator().manual_seed(1611) for _ in range(2))
        for _ in range(5):
            starts = torch.randint(0, len(ids) - train.SEQ_LEN - 1, (8,), generator=want_gen)
            want_x = torch.stack([ids[s:s + train.SEQ_LEN] for s in starts.tolist()])
            want_y = torch.stack([ids[s + 1:s + train.SEQ_LEN + 1] for s in starts.tolist()])
            x, y = train.plain_batch(ids, got_gen, 8)
            self.assertTrue(torch.equal(x, want_x))
            self.assertTrue(torch.equal(y, want_y))

    def test_copy_windows_repeat_a_passage_from_a_line_start(self):
        ids = stream()
        copies = train.CopyWindows(ids, 1.0, seed=3)
        gen = torch.Generator().manual_seed(1)
        lengths = set()
        for _ in range(4):
            x, y = copies.apply(*train.plain_batch(ids, gen, 8))
            for i in range(8):
                self.assertTrue(torch.equal(x[i, 1:], y[i, :-1]), "y is x shifted by one")
                n = is_copy_window(x[i], y[i])
                self.assertIsNotNone(n, f"row {i} is not a repeated passage")
                lengths.add(n)
                # The passage is the stream's text at a line start.
                starts = [s for s in train.line_starts(ids).tolist()
                          if torch.equal(ids[s:s + n], x[i, :n])]
                self.assertTrue(starts, f"row {i}: the passage is not the stream's from a line")
        self.assertGreater(len(lengths), 5, "passage lengths vary")

    def test_fraction_replaces_some_windows_and_leaves_the_others(self):
        ids = stream()
        copies = train.CopyWindows(ids, 0.5, seed=3)
        plain_gen, copy_gen = (torch.Generator().manual_seed(1611) for _ in range(2))
        replaced = kept = 0
        for _ in range(16):
            want_x, want_y = train.plain_batch(ids, plain_gen, 8)
            x, y = copies.apply(*train.plain_batch(ids, copy_gen, 8))
            for i in range(8):
                if torch.equal(x[i], want_x[i]):
                    self.assertTrue(torch.equal(y[i], want_y[i]))
                    kept += 1
                else:
                    self.assertIsNotNone(is_copy_window(x[i], y[i]))
                    replaced += 1
        self.assertGreater(replaced, 32)
        self.assertGreater(kept, 32)

    def test_line_starts(self):
        ids = torch.tensor([5, train.NEWLINE_ID, 6, 7, 0, 8, train.NEWLINE_ID])
        self.assertEqual(train.line_starts(ids).tolist(), [0, 2, 5])


if __name__ == "__main__":
    unittest.main()
