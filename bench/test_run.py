#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Unit tests of bench/run.py's arithmetic: how repetitions are aggregated and
how a comparison's ratio, range, best-vs-best figure and verdict come out of
them. The smoke run renders these columns; only this checks their values.

  python3 bench/test_run.py
"""
import importlib.util
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("bench_run", os.path.join(HERE, "run.py"))
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)


def rows(group, name, unit, values, ratios=None, reference=None):
    """runs.jsonl rows of one measurement: values[i] is repetition i + 1."""
    out = []
    for i, v in enumerate(values):
        r = dict(group=group, name=name, unit=unit, value=v, rep=i + 1)
        if ratios is not None:
            r.update(ratio=ratios[i], ref_value=v / ratios[i], reference=reference)
        out.append(r)
    return out


def one(comps, agg):
    result = run.evaluate(comps, agg)
    assert len(result) == 1
    return result[0]


class Aggregate(unittest.TestCase):
    def test_min_median_max_per_measurement(self):
        agg = run.aggregate(rows("shmverbs", "x", "us", [3.0, 1.0, 2.0, 5.0, 4.0]))
        a = agg[("shmverbs", "x")]
        self.assertEqual((a["min"], a["median"], a["max"]), (1.0, 3.0, 5.0))
        self.assertEqual(a["values"], {1: 3.0, 2: 1.0, 3: 2.0, 4: 5.0, 5: 4.0})

    def test_failed_runs_are_left_out(self):
        r = rows("shmverbs", "x", "us", [2.0, 4.0])
        r.append(dict(group="shmverbs", name="x", unit="us", value=None, rep=3))
        a = run.aggregate(r)[("shmverbs", "x")]
        self.assertEqual(sorted(a["values"]), [1, 2])
        self.assertEqual(a["median"], 3.0)


class Evaluate(unittest.TestCase):
    def lower(self, ours, ref, target=2):
        agg = run.aggregate(rows("shmverbs", "lat", "us", ours) + rows("ucx", "lat", "us", ref))
        comp = dict(label="lat", ours=("shmverbs", "lat"), ref=("ucx", "lat"), kind="lower",
                    target=target)
        return one([comp], agg)

    def test_ratio_is_median_of_same_repetition_ratios(self):
        # Per repetition: 1/1, 4/2, 9/3 -> 1, 2, 3; the median of the
        # values would give 4/2 as well, so make them differ.
        r = self.lower([1.0, 4.0, 30.0], [1.0, 2.0, 3.0])
        self.assertAlmostEqual(r["ratio"], 2.0)
        self.assertAlmostEqual(r["ratio_min"], 1.0)
        self.assertAlmostEqual(r["ratio_max"], 10.0)
        self.assertEqual(r["value"], 4.0)
        self.assertEqual(r["ref_value"], 2.0)

    def test_lower_verdict(self):
        self.assertTrue(self.lower([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])["met"])
        self.assertFalse(self.lower([2.1, 2.1, 2.1], [1.0, 1.0, 1.0])["met"])
        self.assertEqual(self.lower([1.0], [1.0])["target"], "<= 2x")

    def test_higher_verdict(self):
        agg = run.aggregate(rows("shmverbs", "bw", "M/s", [10.0, 12.0, 8.0]) +
                            rows("ucx", "bw", "M/s", [20.0, 12.0, 16.0]))
        comp = dict(label="bw", ours=("shmverbs", "bw"), ref=("ucx", "bw"), kind="higher",
                    target=1)
        r = one([comp], agg)
        # Ratios 0.5, 1.0, 0.5: median 0.5, missed.
        self.assertAlmostEqual(r["ratio"], 0.5)
        self.assertFalse(r["met"])
        self.assertEqual(r["target"], ">= 1x")
        # Best vs best: our fastest (12) against theirs (20).
        self.assertAlmostEqual(r["ratio_best"], 0.6)

    def test_best_vs_best_for_latency_takes_the_lowest_of_each(self):
        r = self.lower([0.5, 0.2, 0.3], [0.1, 0.4, 0.25])
        self.assertAlmostEqual(r["ratio_best"], 2.0)

    def test_repetitions_missing_on_one_side_are_not_paired(self):
        agg = run.aggregate(rows("shmverbs", "lat", "us", [1.0, 2.0, 3.0]) +
                            rows("ucx", "lat", "us", [1.0]))
        comp = dict(label="lat", ours=("shmverbs", "lat"), ref=("ucx", "lat"), kind="lower",
                    target=2)
        r = one([comp], agg)
        self.assertAlmostEqual(r["ratio"], 1.0)
        self.assertAlmostEqual(r["ratio_min"], r["ratio_max"])

    def test_no_target_no_verdict(self):
        r = self.lower([1.0], [1.0], target=None)
        self.assertIsNone(r["met"])
        self.assertIsNone(r["target"])

    def test_missing_reference_gives_no_ratio_and_no_verdict(self):
        agg = run.aggregate(rows("shmverbs", "lat", "us", [1.0, 2.0]))
        comp = dict(label="lat", ours=("shmverbs", "lat"), ref=("ucx", "lat"), kind="lower",
                    target=2)
        r = one([comp], agg)
        self.assertIsNone(r["ratio"])
        self.assertIsNone(r["met"])
        self.assertIsNone(r["ratio_best"])

    def test_queue_rows_carry_their_own_ratio(self):
        agg = run.aggregate(rows("queue", "post_poll_x", "ns/WR", [30.0, 40.0, 31.0],
                                 ratios=[2.0, 3.5, 2.5], reference="plain ring") +
                            rows("queue", "qp_create", "us", [90.0]))
        comps = run.queue_comparisons(agg)
        # Only rows with a ratio are compared; post_poll rows are judged <= 3x.
        self.assertEqual([c["ours"] for c in comps], [("queue", "post_poll_x")])
        r = one(comps, agg)
        self.assertAlmostEqual(r["ratio"], 2.5)
        self.assertTrue(r["met"])
        self.assertEqual(r["reference"], "plain ring")
        self.assertAlmostEqual(r["ref_value"], 12.4)  # median of 15, 11.43, 12.4
        self.assertIsNone(r["ratio_best"])


class Format(unittest.TestCase):
    def test_three_significant_digits_below_ten(self):
        self.assertEqual([run.fmt(v) for v in (0.105156, 0.055, 0.93, 1.914, 19.74, 576.2)],
                         ["0.105", "0.055", "0.93", "1.91", "19.7", "576"])
        self.assertEqual(run.fmt(None), "-")


class ParsePerftest(unittest.TestCase):
    HEADER = (" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    "
              "t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ")
    SUMMARY = " 8       1000          0.09           0.27         0.11     \t       0.12"

    def test_latency_summary_alone(self):
        r = run.parse_perftest("\n".join(["x", self.HEADER, self.SUMMARY, "-" * 20]), "lat")
        self.assertEqual((r["t_min"], r["t_typical"], r["t_avg"], r["samples"]),
                         (0.09, 0.11, 0.12, 0))

    def test_latency_with_samples_takes_their_median(self):
        # -H: the header, then "i, usec" per sample, then header and summary.
        samples = ["1, 0.0901339", "2, 0.100149", "3, 0.105156", "4, 0.110164"]
        out = "\n".join([self.HEADER, "#, usec"] + samples + [self.HEADER, self.SUMMARY])
        r = run.parse_perftest(out, "lat")
        self.assertAlmostEqual(r["t_typical"], (0.100149 + 0.105156) / 2)
        self.assertEqual((r["t_min"], r["t_avg"], r["samples"]), (0.09, 0.12, 4))

    def test_no_result_line_is_an_error(self):
        with self.assertRaises(run.CaseError):
            run.parse_perftest("\n".join([self.HEADER, "#, usec", "1, 0.1"]), "lat")


if __name__ == "__main__":
    unittest.main()
