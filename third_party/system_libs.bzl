"""Wraps libraries installed from Debian packages as Bazel targets, so the build is offline.

Headers under /usr/include are on the compiler's built-in path and need nothing; a library
whose headers live elsewhere (Open MPI) has them linked into the repository. Link flags come
from pkg-config, run once when the repository is made.
"""

def _pkg_config_library_impl(ctx):
    linkopts = []
    if ctx.attr.modules:
        r = ctx.execute(["pkg-config", "--libs"] + ctx.attr.modules)
        if r.return_code != 0:
            fail("pkg-config found no %s: %s\nRun tools/setup.sh to install Tandem's packages." %
                 (" ".join(ctx.attr.modules), r.stderr))
        linkopts = r.stdout.strip().split(" ")
    linkopts += ctx.attr.extra_linkopts
    hdrs = "[]"
    includes = "[]"
    if ctx.attr.include_dir:
        if not ctx.path(ctx.attr.include_dir).exists:
            fail("%s is missing; run tools/setup.sh" % ctx.attr.include_dir)
        ctx.symlink(ctx.attr.include_dir, "include")
        hdrs = 'glob(["include/**"])'
        includes = '["include"]'
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("BUILD", """package(default_visibility = ["//visibility:public"])

cc_library(
    name = "lib",
    hdrs = {hdrs},
    includes = {includes},
    defines = {defines},
    linkopts = {linkopts},
)
""".format(hdrs = hdrs, includes = includes, defines = repr(ctx.attr.defines),
           linkopts = repr([o for o in linkopts if o])))

pkg_config_library = repository_rule(
    implementation = _pkg_config_library_impl,
    attrs = {
        "modules": attr.string_list(doc = "pkg-config modules whose --libs to link"),
        "include_dir": attr.string(doc = "headers outside the compiler's built-in path"),
        "defines": attr.string_list(),
        "extra_linkopts": attr.string_list(),
    },
    local = True,
)
