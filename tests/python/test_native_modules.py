"""The compiled modules beside the torch that Python imported: the crash class met on a GPU, on the CPU.

What it is: two checks on the INSTALLED accumplan._core and accumplan._probes.
  - Each module's dynamic symbol table defines nothing of the C++ runtime (std::, __cxa_, __gxx_):
    a module that exports its own copy of libstdc++'s symbols binds partly to torch's copy and
    partly to its own, which crashed the first number written to a stream (SIGSEGV on the GPU
    machine). The checker is shown to find such symbols in torch's own libc10.
  - torch imported first, then a plan whose search runs a window out of memory: the path after an
    out-of-memory probe is where that crash happened.
What it is not: a test of the plan's figures (test_measure.py and the rest do that).
"""
import glob
import os
import re
import shutil
import subprocess
import unittest
import warnings

import torch  # first, as a user's script does: the C++ runtime in the process is torch's

import accumplan  # noqa: E402
import accumplan._core  # noqa: E402

# Mangled names of the C++ runtime: std:: (functions, vtables, typeinfo), the ABI's __cxa_ and
# __gxx_ entry points.
RUNTIME = re.compile(r"^(_ZN?K?St|_ZSt|_ZT[VIS]N?K?St|__cxa_|__gxx_)")


def defined_dynamic_symbols(path):
    """The symbols a shared object offers other objects: defined, global or weak (nm's upper-case
    types; a lower-case one is local and binds nothing outside)."""
    out = subprocess.run(["nm", "-D", "--defined-only", path], check=True, capture_output=True, text=True).stdout
    rows = [line.split() for line in out.splitlines() if line.strip()]
    return [row[-1] for row in rows if len(row) >= 2 and row[-2].isupper()]


def runtime_symbols(path):
    return [s for s in defined_dynamic_symbols(path) if RUNTIME.match(s)]


def native_modules():
    folder = os.path.dirname(accumplan.__file__)
    return sorted(glob.glob(os.path.join(folder, "_core*.so")) + glob.glob(os.path.join(folder, "_probes*.so")))


@unittest.skipUnless(shutil.which("nm"), "nm (binutils) is not installed: the symbol checks need it")
class ExportedSymbols(unittest.TestCase):
    def test_both_modules_are_installed(self):
        names = [os.path.basename(p).split(".")[0] for p in native_modules()]
        self.assertEqual(names, ["_core", "_probes"])

    def test_no_module_exports_the_cpp_runtime(self):
        for path in native_modules():
            with self.subTest(module=os.path.basename(path)):
                self.assertEqual(runtime_symbols(path), [])
                # What a module must export: its init function, and little else.
                init = "PyInit_" + os.path.basename(path).split(".")[0]
                self.assertIn(init, defined_dynamic_symbols(path))

    def test_the_checker_finds_runtime_symbols_where_they_are(self):
        c10 = glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so*"))
        self.assertTrue(c10, "torch ships no libc10.so")
        self.assertGreater(len(runtime_symbols(c10[0])), 0)


class Quadratic(torch.nn.Module):
    """Activations that grow with the square of the batch (a b x b attention of the batch with
    itself), so a line fitted at small sizes promises more than fits: the search's probe at the
    line's edge runs out of memory."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 4)

    def forward(self, x):
        attn = torch.softmax(x @ x.t(), dim=1)
        return self.lin(attn @ x)


class AfterAnOutOfMemoryProbe(unittest.TestCase):
    def test_a_plan_whose_search_ran_out_of_memory_completes(self):
        torch.manual_seed(0)
        model = Quadratic()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = accumplan.plan(model, (x,), y, target_batch=4096, optimizer=opt, memory_budget="4MiB",
                                  progress=False)
        trials = plan.profile["trials"]
        self.assertTrue(any(not t["fit"] for t in trials), trials)
        self.assertTrue(plan.confirmed, plan.reason)
        self.assertIn("micro", str(plan))  # the plan's text: numbers written to streams after the OOM
        self.assertEqual(sum(plan.microbatch_sizes), 4096)


if __name__ == "__main__":
    unittest.main()
