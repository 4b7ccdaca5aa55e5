"""Plan.save refuses what the CLI's --out refuses: a name ending in '/' names a directory."""
import os
import tempfile
import unittest

from helpers import GOLDEN_PLAN

import accumplan


class SavePaths(unittest.TestCase):
    def test_a_name_ending_in_a_slash_is_refused_naming_path_and_nothing_is_written(self):
        plan = accumplan.load_plan(GOLDEN_PLAN)
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(ValueError, r"^path '.*p\.json/': no such directory") as caught:
                plan.save(os.path.join(d, "p.json") + "/")
            self.assertNotIn("\n", str(caught.exception))
            self.assertEqual(os.listdir(d), [])

    def test_a_slash_after_an_existing_file_is_refused_and_the_file_kept(self):
        plan = accumplan.load_plan(GOLDEN_PLAN)
        with tempfile.TemporaryDirectory() as d:
            existing = os.path.join(d, "p.json")
            with open(existing, "w") as f:
                f.write("old")
            with self.assertRaisesRegex(ValueError, r"^path '.*p\.json/'"):
                plan.save(existing + "/")
            with open(existing) as f:
                self.assertEqual(f.read(), "old")

    def test_a_plain_file_name_is_still_written(self):
        plan = accumplan.load_plan(GOLDEN_PLAN)
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "p.json")
            plan.save(out)
            self.assertEqual(accumplan.load_plan(out).microbatch_sizes, plan.microbatch_sizes)


if __name__ == "__main__":
    unittest.main()
