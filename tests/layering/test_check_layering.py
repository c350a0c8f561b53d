"""scripts/check_layering.py on small planted trees and link graphs: it fails on an include
or a link that goes up or sideways, names the file, the line (or the target) and the modules,
fails closed on what it does not know (a folder that is no module, a computed include), and
passes what the layering allows (unit tests into what their module uses, test support)."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.environ.get("DCF_SOURCE_DIR",
                      os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, "scripts", "check_layering.py")
# This build's link graph (cmake/LinkGraph.cmake); CTest sets it.
LINK_GRAPH = os.environ.get("DCF_LINK_GRAPH")


def write_tree(root, tree):
    for path, text in tree.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)


def run(tree, links=None):
    """Writes `tree` ({path: text}) to a temp dir and runs the check on it; `links`, a list
    of link-graph lines, is passed as --links."""
    with tempfile.TemporaryDirectory() as root:
        write_tree(root, tree)
        args = [sys.executable, SCRIPT, "--root", root]
        if links is not None:
            graph = os.path.join(root, "link_graph.tsv")
            with open(graph, "w") as f:
                f.write("".join(line + "\n" for line in links))
            args += ["--links", graph]
        return subprocess.run(args, capture_output=True, text=True, timeout=60)


def include(*headers):
    return "".join(f'#include "{h}"\n' for h in headers)


class CheckLayeringTest(unittest.TestCase):
    def test_the_repository_passes(self):
        args = [sys.executable, SCRIPT, "--root", ROOT]
        if LINK_GRAPH:
            args += ["--links", LINK_GRAPH]
        r = subprocess.run(args, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("every include goes down", r.stdout)
        if LINK_GRAPH:  # the build's libraries were checked too
            self.assertRegex(r.stdout, r"and [1-9][0-9]+ links")

    def test_design_md_lists_every_module(self):
        # docs/DESIGN.md "Modules" is the table people read; MAY_USE is the one the check
        # holds the build to. Every module has its row there, and no row names a module the
        # check does not know.
        sys.path.insert(0, os.path.dirname(SCRIPT))
        try:
            import check_layering
        finally:
            sys.path.pop(0)
        with open(os.path.join(ROOT, "docs", "DESIGN.md")) as f:
            text = f.read()
        section = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
        rows = [line.split("|")[1].strip() for line in section.splitlines()
                if line.startswith("| ") and not line.startswith("| module")]
        self.assertEqual(rows, check_layering.ORDER)

    def test_allowed_includes_pass(self):
        r = run({
            "engine/kv/kv.h": include("engine/model/model_config.h", "engine/common/logging.h"),
            "engine/serving/engine.cc": include("engine/execution/backend.h",
                                                "engine/tokenizer/tokenizer.h", "local.h"),
            "engine/cuda/k.cu": include("engine/simt/cuda_compat.h"),
            "engine/backends/f.cc": include("engine/cpu/cpu_backend.h", "engine/cuda/c.h"),
            "server/s.cc": include("engine/serving/engine.h", "dcformer/v1/dcformer.pb.h"),
            "client/c.cc": include("engine/common/flag_names.h"),
            # A unit test may use its module, what the module uses, and test support; the
            # CUDA kernels' tests the CPU oracle, the backends' tests the engine on them.
            "tests/unit/cuda/t.cc": include("engine/cuda/norm.h", "engine/cpu/cpu_ops.h",
                                            "tests/testing/golden.h",
                                            "tests/unit/simt/cuda_test_util.h"),
            "tests/unit/serving/t.cc": include("engine/serving/engine.h",
                                               "engine/execution/backend.h",
                                               "tests/testing/forwarding_backend.h",
                                               "tests/unit/kv/helper.h"),
            "tests/unit/backends/engine_test.cc": include(
                "engine/serving/engine.h", "engine/cpu/cpu_backend.h",
                "engine/cuda/cuda_backend_factory.h", "engine/simt/simt_testing.h",
                "engine/tokenizer/tokenizer.h"),
            "tests/unit/simt/a.cc": include("tests/unit/simt/toolkit/conversions.inc"),
            "tests/integration/x.cc": include("server/server_main.h", "tests/unit/kv/t.h"),
            # System and library headers, in either form; the server may use gRPC.
            "engine/cpu/m.cc": "#include <vector>\n#include <omp.h>\n#include \"absl/strings/str_cat.h\"\n",
            "server/g.cc": "#include <grpcpp/grpcpp.h>\n#include \"prometheus/counter.h\"\n",
            "engine/kv/k.hpp": include("../model/model_config.h"),
        })
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_an_include_into_a_higher_module_fails(self):
        r = run({"engine/kv/kv_cache_manager.cc": "// x\n" + include("engine/serving/engine.h")})
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("engine/kv/kv_cache_manager.cc:2: includes engine/serving/engine.h: "
                      "kv -> serving", r.stdout)
        self.assertIn("1 include(s) or link(s) break the layering", r.stdout)

    def test_sideways_includes_fail(self):
        r = run({
            "engine/cpu/a.cc": include("engine/cuda/gemm.h"),              # backend -> backend
            "engine/serving/b.cc": include("engine/cpu/cpu_backend.h"),    # a concrete backend
            "tests/testing/c.h": include("server/dcformer_server.h"),      # support -> server
            "server/d.cc": include("tests/testing/fault_injecting_backend.h"),
            "engine/simt/e.h": include("engine/cuda/device_util.cuh"),     # platform -> backend
        })
        self.assertEqual(r.returncode, 1, r.stdout)
        for line in ("engine/cpu/a.cc:1", "engine/serving/b.cc:1", "tests/testing/c.h:1",
                     "server/d.cc:1", "engine/simt/e.h:1"):
            self.assertIn(line, r.stdout)
        self.assertIn("5 include(s) or link(s) break the layering", r.stdout)

    def test_a_unit_test_may_not_reach_above_its_module(self):
        r = run({
            "tests/unit/kv/t.cc": include("engine/serving/scheduler.h"),
            "tests/unit/model/u.cc": include("engine/backends/backend_factory.h"),
            "tests/unit/weights/v.cc": include("tests/unit/serving/helper.h"),
        })
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("tests/unit/kv/t.cc:1: includes engine/serving/scheduler.h: "
                      "tests/unit/kv -> serving", r.stdout)
        self.assertIn("3 include(s) or link(s) break the layering", r.stdout)

    def test_a_unit_test_follows_the_dependency_graph_not_the_rank(self):
        # cpu, cuda and simt rank below serving, but serving uses none of them: its tests
        # run the engine on fakes (the engine on real backends is tests/unit/backends).
        r = run({
            "tests/unit/serving/engine_test.cc": include("engine/cpu/cpu_backend.h",
                                                         "engine/cuda/cuda_backend_factory.h",
                                                         "engine/simt/simt_testing.h"),
            "tests/unit/cpu/t.cc": include("engine/cuda/gemm.h",          # cuda ranks above
                                           "engine/tokenizer/tokenizer.h"),  # below, unused
            "tests/unit/kv/t.cc": include("engine/sampling/token_sampler.h"),
        })
        self.assertEqual(r.returncode, 1, r.stdout)
        for line in ("tests/unit/serving/engine_test.cc:1: includes engine/cpu/cpu_backend.h: "
                     "tests/unit/serving -> cpu",
                     "tests/unit/serving/engine_test.cc:2: includes "
                     "engine/cuda/cuda_backend_factory.h: tests/unit/serving -> cuda",
                     "tests/unit/serving/engine_test.cc:3: includes engine/simt/simt_testing.h: "
                     "tests/unit/serving -> simt",
                     "tests/unit/cpu/t.cc:1", "tests/unit/cpu/t.cc:2", "tests/unit/kv/t.cc:1"):
            self.assertIn(line, r.stdout)
        self.assertIn("6 include(s) or link(s) break the layering", r.stdout)

    # The loopholes an independent review planted in the first version of the check (each
    # passed it): every one must fail now.
    def test_the_engine_includes_no_grpc_protobuf_boost_prometheus_or_http(self):
        r = run({"engine/serving/s.cc": "#include <grpcpp/grpcpp.h>\n"
                                        "#include <google/protobuf/message_lite.h>\n"
                                        "#include <boost/beast/http.hpp>\n"
                                        '#include "prometheus/counter.h"\n'
                                        "#include <httplib.h>\n"
                                        '#include "civetweb.h"\n'
                                        '#include "grpc/grpc.h"\n'
                                        '#include "some/api.pb.h"\n'})
        self.assertEqual(r.returncode, 1, r.stdout)
        for n in range(1, 9):
            self.assertIn(f"engine/serving/s.cc:{n}: includes ", r.stdout)
        self.assertIn("engine/serving/s.cc:1: includes grpcpp/grpcpp.h: the engine (serving) "
                      "stays free of gRPC", r.stdout)
        self.assertIn("8 include(s) or link(s) break the layering", r.stdout)

    def test_angled_and_relative_includes_are_resolved(self):
        r = run({"engine/kv/a.cc": "#include <engine/serving/engine.h>\n"
                                   '#include "../serving/engine.h"\n'
                                   '#include "./engine/serving/engine.h"\n'
                                   '#include "engine/kv/../serving/engine.h"\n'
                                   "#include <./engine//serving/engine.h>\n"
                                   '#include "../../server/dcformer_server.h"\n'
                                   '#include "../../../outside.h"\n'})
        self.assertEqual(r.returncode, 1, r.stdout)
        for n in range(1, 6):
            self.assertIn(f"engine/kv/a.cc:{n}: includes ", r.stdout)
            self.assertIn(f"kv -> serving", r.stdout)
        self.assertIn("engine/kv/a.cc:6: includes ../../server/dcformer_server.h: kv -> server",
                      r.stdout)
        self.assertIn("engine/kv/a.cc:7: includes ../../../outside.h: a path outside",
                      r.stdout)
        self.assertIn("7 include(s) or link(s) break the layering", r.stdout)

    def test_relative_includes_follow_the_files_that_exist(self):
        # "./engine/serving/engine.h" from engine/kv names the root's file when it exists
        # (the compiler finds no engine/kv/engine/serving/engine.h and searches the root).
        r = run({"engine/serving/engine.h": "",
                 "engine/kv/a.cc": '#include "./engine/serving/engine.h"\n'})
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("engine/kv/a.cc:1: includes ./engine/serving/engine.h: kv -> serving",
                      r.stdout)

    def test_every_c_and_cpp_extension_is_scanned(self):
        exts = ("hpp", "hh", "hxx", "cpp", "cxx", "c", "ipp", "tcc", "cuh", "inc")
        r = run({f"engine/kv/a.{e}": include("engine/serving/engine.h") for e in exts})
        self.assertEqual(r.returncode, 1, r.stdout)
        for e in exts:
            self.assertIn(f"engine/kv/a.{e}:1: includes engine/serving/engine.h: kv -> serving",
                          r.stdout)

    def test_an_unknown_folder_fails_both_ways(self):
        r = run({
            "engine/newmod/x.cc": include("server/dcformer_server.h"),   # includes anything
            "engine/kv/y.cc": include("engine/newmod/x.h"),            # included from below
            "engine/loose.cc": "",                                      # no module at all
            "tests/unit/newdir/t.cc": include("server/dcformer_server.h"),
            "lib/z.cc": "",
        })
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("engine/newmod/x.cc: engine/newmod is not a module", r.stdout)
        self.assertIn("engine/kv/y.cc:1: includes engine/newmod/x.h: kv -> engine/newmod is "
                      "not a module", r.stdout)
        self.assertIn("engine/loose.cc: engine/ is not a module", r.stdout)
        self.assertIn("tests/unit/newdir/t.cc: tests/unit/newdir tests no module", r.stdout)
        self.assertIn("lib/z.cc: lib/ is not a module", r.stdout)
        self.assertIn("5 include(s) or link(s) break the layering", r.stdout)

    def test_production_code_includes_no_test_path(self):
        r = run({
            "engine/serving/a.cc": include("tests/unit/serving/helper.h"),
            "server/b.cc": include("tests/integration/harness.h"),
            "engine/kv/c.cc": include("../../tests/testing/temp_dir.h"),
            "tests/testing/d.h": include("tests/unit/kv/helper.h"),
            "client/e.cc": "#include <tests/fuzz/f.h>\n",
        })
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("engine/serving/a.cc:1: includes tests/unit/serving/helper.h: "
                      "serving -> tests/unit/serving", r.stdout)
        self.assertIn("server/b.cc:1: includes tests/integration/harness.h: server -> tests",
                      r.stdout)
        self.assertIn("engine/kv/c.cc:1: includes ../../tests/testing/temp_dir.h: kv -> testing",
                      r.stdout)
        self.assertIn("tests/testing/d.h:1", r.stdout)
        self.assertIn("client/e.cc:1", r.stdout)
        self.assertIn("5 include(s) or link(s) break the layering", r.stdout)

    def test_a_computed_include_fails(self):
        r = run({"engine/kv/a.cc": "#define H \"engine/serving/engine.h\"\n#include H\n",
                 "tests/unit/kv/t.cc": "#  include_next  SOME_HEADER\n",
                 "tests/fuzz/f.cc": "#include H\n"})  # free tests may
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("engine/kv/a.cc:2: #include H: the check cannot follow a computed "
                      "include", r.stdout)
        self.assertIn("tests/unit/kv/t.cc:1: #include_next SOME_HEADER", r.stdout)
        self.assertIn("2 include(s) or link(s) break the layering", r.stdout)

    def test_a_private_header_is_included_only_beside_it(self):
        # *_impl.h, *_inl.h and *_internal.h belong to their folder: the sources beside
        # them include them; another module, the module's unit tests and the free tests
        # (which may include anything else) may not.
        beside = {
            "engine/serving/engine_impl.h": "// private\n",
            "engine/serving/engine.cc": include("engine/serving/engine_impl.h"),
            "engine/serving/loop.cc": include("engine_impl.h"),
            "engine/cpu/k_inl.h": "// private\n",
            "engine/cpu/k.cc": include("engine/cpu/k_inl.h"),
            "engine/cuda/q_internal.cuh": "// private\n",
            "engine/cuda/q.cu": include("q_internal.cuh"),
            # not private: the suffix is the file name's end, not any "_impl"
            "engine/kv/impl_choice.h": "",
            "tests/unit/kv/t.cc": include("engine/kv/impl_choice.h"),
        }
        r = run(beside)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = run(dict(beside, **{
            "server/s.cc": include("engine/serving/engine_impl.h"),
            "tests/unit/serving/t.cc": include("engine/serving/engine_impl.h"),
            "tests/integration/x.cc": include("engine/cpu/k_inl.h"),
            "engine/backends/b.cc": include("engine/cuda/q_internal.cuh"),
            "tests/fuzz/f.cc": "#include H\n",  # the free tests' other freedoms stay
        }))
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("server/s.cc:1: includes engine/serving/engine_impl.h: "
                      "engine/serving/engine_impl.h is private to engine/serving/", r.stdout)
        for line in ("tests/unit/serving/t.cc:1", "tests/integration/x.cc:1",
                     "engine/backends/b.cc:1"):
            self.assertIn(line, r.stdout)
        self.assertIn("4 include(s) or link(s) break the layering", r.stdout)

    # Links: the graph cmake/LinkGraph.cmake writes.
    GRAPH = ["target\tdcformer_model\tSTATIC_LIBRARY\tengine/model",
             "target\tdcformer_kv\tSTATIC_LIBRARY\tengine/kv",
             "target\tdcformer_cpu\tSTATIC_LIBRARY\tengine/cpu",
             "target\tdcformer_serving\tSTATIC_LIBRARY\tengine/serving",
             "target\tdcformer_server_lib\tSTATIC_LIBRARY\tserver",
             "target\tdcf_blas\tINTERFACE_LIBRARY\t",
             "target\tkv_test\tEXECUTABLE\ttests/unit/kv",
             "target\tserver-faults\tEXECUTABLE\ttests/integration",
             "link\tdcformer_kv\tdcformer_model",
             "link\tdcformer_serving\tdcformer_kv",
             "link\tdcformer_serving\tabsl::random_random",
             "link\tdcformer_cpu\t$<LINK_ONLY:dcf_blas>",
             "link\tdcformer_server_lib\tdcformer_serving",
             "link\tdcformer_server_lib\tgRPC::grpc++",
             "link\tkv_test\tdcformer_kv",
             "link\tkv_test\tGTest::gtest",
             "link\tserver-faults\tdcformer_server_lib"]

    def test_allowed_links_pass(self):
        r = run({}, links=self.GRAPH)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("and 9 links, every include goes down", r.stdout)

    def test_a_link_up_or_sideways_fails(self):
        r = run({}, links=self.GRAPH + [
            "link\tdcformer_kv\tdcformer_serving",             # the review's planted edge
            "link\tdcformer_model\t$<LINK_ONLY:dcformer_kv>",  # a PRIVATE one
            "link\tdcformer_serving\t$<$<CONFIG:Debug>:dcformer_cpu>",
            "link\tkv_test\tdcformer_serving",                 # a unit test above its module
            "link\tdcformer_serving\tgRPC::grpc++",            # the engine on gRPC
            "link\tdcformer_kv\tdcformer_servng",              # not a target
            "target\tdcformer_newmod\tSTATIC_LIBRARY\tengine/newmod"])
        self.assertEqual(r.returncode, 1, r.stdout)
        for line in ("target dcformer_kv links dcformer_serving: kv -> serving goes up or "
                     "sideways (kv may link common, weights, model besides itself)",
                     "target dcformer_model links dcformer_kv: model -> kv",
                     "target dcformer_serving links dcformer_cpu: serving -> cpu",
                     "target kv_test links dcformer_serving: tests/unit/kv -> serving",
                     "target dcformer_serving links gRPC::grpc++: the engine (serving) stays "
                     "free of gRPC",
                     "target dcformer_kv links dcformer_servng: not a target of this build",
                     "target dcformer_newmod (in engine/newmod/): engine/newmod is not a module"):
            self.assertIn(line, r.stdout)
        self.assertIn("7 include(s) or link(s) break the layering", r.stdout)

    @unittest.skipUnless(shutil.which("cmake"), "cmake is not on PATH")
    def test_cmake_writes_the_graph_and_a_planted_link_fails(self):
        # A planted project: cmake/LinkGraph.cmake writes its graph at configure time; the
        # review's planted target_link_libraries(dcformer_kv PUBLIC dcformer_serving) fails.
        tree = {
            "CMakeLists.txt": "cmake_minimum_required(VERSION 3.25)\n"
                              "project(planted LANGUAGES NONE)\n"
                              "add_subdirectory(engine/model)\nadd_subdirectory(engine/kv)\n"
                              "add_subdirectory(engine/serving)\n"
                              f"include({ROOT}/cmake/LinkGraph.cmake)\n"
                              "dcf_write_link_graph(${CMAKE_BINARY_DIR}/link_graph.tsv)\n",
            "engine/model/CMakeLists.txt": "add_library(dcformer_model INTERFACE)\n",
            "engine/kv/CMakeLists.txt": "add_library(dcformer_kv INTERFACE)\n"
                                        "target_link_libraries(dcformer_kv INTERFACE "
                                        "dcformer_model)\n",
            "engine/serving/CMakeLists.txt": "add_library(dcformer_serving INTERFACE)\n"
                                             "target_link_libraries(dcformer_serving INTERFACE "
                                             "dcformer_kv)\n",
        }
        with tempfile.TemporaryDirectory() as root:
            write_tree(root, tree)
            build = os.path.join(root, "build")

            def configure_and_check():
                subprocess.run(["cmake", "-S", root, "-B", build], check=True,
                               capture_output=True, timeout=120)
                return subprocess.run([sys.executable, SCRIPT, "--root", root, "--links",
                                       os.path.join(build, "link_graph.tsv")],
                                      capture_output=True, text=True, timeout=60)

            r = configure_and_check()
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("and 2 links", r.stdout)
            with open(os.path.join(root, "engine/kv/CMakeLists.txt"), "a") as f:
                f.write("target_link_libraries(dcformer_kv INTERFACE dcformer_serving)\n")
            r = configure_and_check()
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn("target dcformer_kv links dcformer_serving: kv -> serving", r.stdout)


if __name__ == "__main__":
    unittest.main()
