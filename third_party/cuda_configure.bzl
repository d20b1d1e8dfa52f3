"""Finds CUDA and NCCL, or makes a CPU-only stand-in, like TensorFlow's cuda_configure.

@local_config_cuda//:defs.bzl gives CUDA_ENABLED, NVCC (its absolute path) and
if_cuda(a, b); @local_config_cuda//:cuda is the runtime and cuBLAS(Lt) to link,
@local_config_cuda//:nccl adds NCCL (only the NCCL communicator needs it).
CUDA is looked for at $CUDA_PATH, else /usr/local/cuda; it counts as present only when
nvcc, cuda_runtime.h, cublasLt.h, nccl.h and their libraries are all there.
"""

_NEEDED = [
    "bin/nvcc",
    "include/cuda_runtime.h",
    "include/cublasLt.h",
    "lib64/libcudart.so",
    "lib64/libcublasLt.so",
    "lib64/libcublas.so",
]

def _find_nccl(ctx, root):
    for inc, lib in [
        (root + "/include", root + "/lib64"),
        ("/usr/include", "/usr/lib/x86_64-linux-gnu"),
    ]:
        if ctx.path(inc + "/nccl.h").exists and ctx.path(lib + "/libnccl.so").exists:
            return inc, lib
    return None, None

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    missing = [f for f in _NEEDED if not ctx.path(root + "/" + f).exists]
    nccl_inc, nccl_lib = _find_nccl(ctx, root)
    if not missing and nccl_inc == None:
        missing.append("nccl.h and libnccl.so")
    enabled = len(missing) == 0
    ctx.file("WORKSPACE", 'workspace(name = "local_config_cuda")\n')
    if enabled:
        real_root = str(ctx.path(root).realpath)
        ctx.symlink(real_root + "/include", "include")
        nccl_hdrs = ""
        if nccl_inc != real_root + "/include" and nccl_inc != root + "/include":
            ctx.symlink(nccl_inc + "/nccl.h", "nccl_include/nccl.h")
            nccl_hdrs = ' + ["nccl_include/nccl.h"]'
        lib = real_root + "/lib64"
        ctx.file("BUILD", """package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda",
    hdrs = glob(["include/**"]),
    includes = ["include"],
    linkopts = [
        "-L{lib}", "-Wl,-rpath,{lib}",
        "-lcublasLt", "-lcublas", "-lcudart",
    ],
)

# NCCL apart: only the binaries with the NCCL communicator load libnccl.
cc_library(
    name = "nccl",
    hdrs = []{nccl_hdrs},
    includes = ["nccl_include"],
    linkopts = ["-L{nccl_lib}", "-Wl,-rpath,{nccl_lib}", "-lnccl"],
    deps = [":cuda"],
)
""".format(lib = lib, nccl_lib = nccl_lib, nccl_hdrs = nccl_hdrs))
        nvcc = real_root + "/bin/nvcc"
        why = "CUDA found at " + real_root
    else:
        ctx.file("BUILD", """package(default_visibility = ["//visibility:public"])

cc_library(name = "cuda")

cc_library(name = "nccl")
""")
        nvcc = ""
        why = "no CUDA at %s (missing %s): CPU-only build" % (root, ", ".join(missing))
    ctx.file("defs.bzl", """# Made by cuda_configure: {why}.
CUDA_ENABLED = {enabled}
NVCC = "{nvcc}"

def if_cuda(if_true, if_false = []):
    return if_true if CUDA_ENABLED else if_false
""".format(why = why, enabled = enabled, nvcc = nvcc))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH"],
    local = True,
)
