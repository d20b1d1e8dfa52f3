"""cuda_library: .cu files compiled by nvcc into objects a cc_library links.

Include paths and defines come from the deps' CcInfo, so a .cu file includes project
headers exactly as a .cc file does. Code is built for sm_80 and sm_90 plus sm_90 PTX, so
A100, H100 and H200 run it and newer GPUs JIT the PTX.
"""

load("@local_config_cuda//:defs.bzl", "CUDA_ENABLED", "NVCC")

_GENCODE = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

def _cuda_objects_impl(ctx):
    cc = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps]).compilation_context
    args = ["-std=c++17", "-O3", "--expt-relaxed-constexpr", "-Xcompiler=-fPIC", "-I."]
    args += ["-I" + ctx.bin_dir.path]
    for d in cc.includes.to_list() + cc.quote_includes.to_list() + cc.system_includes.to_list():
        args += ["-I" + d]
    for d in cc.defines.to_list() + ctx.attr.defines:
        args += ["-D" + d]
    args += _GENCODE + ctx.attr.copts
    inputs = depset(ctx.files.srcs + ctx.files.hdrs, transitive = [cc.headers])
    outs = []
    for src in ctx.files.srcs:
        out = ctx.actions.declare_file(ctx.label.name + "/" + src.basename[:-3] + ".o")
        ctx.actions.run(
            executable = ctx.attr.nvcc,
            arguments = args + ["-c", src.path, "-o", out.path],
            inputs = inputs,
            outputs = [out],
            mnemonic = "Nvcc",
            progress_message = "nvcc " + src.short_path,
            use_default_shell_env = True,
        )
        outs.append(out)
    return [DefaultInfo(files = depset(outs))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "defines": attr.string_list(),
        "copts": attr.string_list(),
        "nvcc": attr.string(),
    },
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], **kwargs):
    """A cc_library of nvcc-compiled objects; empty where CUDA is absent."""
    if not CUDA_ENABLED:
        native.cc_library(name = name, hdrs = hdrs, deps = deps, **kwargs)
        return
    _cuda_objects(
        name = name + "_objects",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + ["@local_config_cuda//:cuda"],
        copts = copts,
        nvcc = NVCC,
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_objects"],
        hdrs = hdrs,
        deps = deps + ["@local_config_cuda//:cuda"],
        alwayslink = True,
        **kwargs
    )
