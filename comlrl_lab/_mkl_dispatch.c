/* Lets MKL pick its kernels on an AMD CPU by the instruction sets the CPU reports, as it does on an Intel one.
 *
 * MKL (statically linked into torch's PyPI wheels) asks mkl_serv_intel_cpu_true() whether the CPU is Intel's and,
 * when it is not, keeps to its generic code even where the CPU has AVX-512: one-thread fp32 GEMMs of the tiny
 * model's and SmolLM2-135M's shapes ran at 82-94 GFLOP/s on an AMD EPYC (family 26), and at 191-225 GFLOP/s through
 * MKL's AVX-512 kernels once this answer was 1 (benchmarks/cpu_gemm.py). The symbol is exported by libtorch_cpu.so and
 * called through its PLT, so a definition loaded into the global scope before torch is loaded takes its place.
 * comlrl_lab.mkl_dispatch decides whether to load this library (AMD, AVX-512, torch not yet imported) with
 * RTLD_GLOBAL; importing it as a Python module would load it RTLD_LOCAL, where it would change nothing.
 */
#include <Python.h>

PyMODINIT_FUNC PyInit__mkl_dispatch(void);

int mkl_serv_intel_cpu_true(void) { return 1; }

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_mkl_dispatch",
    "MKL's vendor check answered 'Intel'; loaded with RTLD_GLOBAL by comlrl_lab.mkl_dispatch, not imported.",
    -1,
    NULL,
};

PyMODINIT_FUNC PyInit__mkl_dispatch(void) { return PyModule_Create(&module); }
