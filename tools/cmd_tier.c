/* SPDX-License-Identifier: Apache-2.0 */
/*
 * umbp tier / umbp bench tier — run python/umbp/tier_server.py and
 * python/umbp/bench_tier.py.
 *
 * The tier is a Mooncake Store client, and Mooncake publishes its client for
 * Python and C++ only (PyPI mooncake-transfer-engine[-non-cuda]); so the
 * tier is written in Python over libumbp, and these commands exec a Python
 * that has both packages. Which one, in order:
 *   1. $UMBP_PYTHON;
 *   2. run from its build tree, the source tree's .venv-cpu/bin/python (made by
 *      scripts/setup-python.sh, with Mooncake in it), if it exists;
 *   3. the wheel's copy (`pip install .`): the python3 in the directory this
 *      binary is in, if there is one. pip puts the script beside the Python it
 *      installed the package for (a venv's or conda env's bin/), so this is
 *      the Python that has umbp even when the binary is run by its absolute
 *      path with that environment not on PATH (systemd, cron);
 *   4. python3 from PATH (after `pip install --user .`, or `meson install`).
 * In a build tree the source tree's python/ goes first on PYTHONPATH, so the
 * package matches this build's library (umbp._lib finds libumbp.so in build dirs).
 * Options, help and exit codes are the Python module's (argparse), one text
 * for both ways of starting it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_config.h" /* UMBP_WHEEL */
#include "cmd_tier.h"

#ifndef UMBP_SOURCE_ROOT
#define UMBP_SOURCE_ROOT ""
#endif
#ifndef UMBP_BUILD_ROOT
#define UMBP_BUILD_ROOT ""
#endif

/* The source tree, when this binary is the one in its build tree (an
 * installed copy, or a wheel's, never looks there). */
static const char *source_tree(void) {
  static char exe[4096];
  size_t b = strlen(UMBP_BUILD_ROOT);
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (!b || !UMBP_SOURCE_ROOT[0] || n <= (ssize_t)b) return NULL;
  exe[n] = 0;
  return strncmp(exe, UMBP_BUILD_ROOT, b) == 0 && exe[b] == '/' ? UMBP_SOURCE_ROOT : NULL;
}

static const char *pick_python(char *buf, size_t n) {
  const char *env = getenv("UMBP_PYTHON");
  if (env && *env) return env;
  if (source_tree()) {
    snprintf(buf, n, "%s/.venv-cpu/bin/python", UMBP_SOURCE_ROOT);
    if (access(buf, X_OK) == 0) return buf;
  }
#if UMBP_WHEEL
  char exe[4096];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0) {
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = 0;
      int w = snprintf(buf, n, "%s/python3", exe);
      if (w > 0 && (size_t)w < n && access(buf, X_OK) == 0) return buf;
    }
  }
#endif
  return "python3";
}

/* exec `python -c BOOT module argv[1..]`; returns only on failure. */
static int run_module(const char *what, const char *module, int argc, char **argv) {
  char pybuf[4096], pathbuf[8192];
  const char *py = pick_python(pybuf, sizeof pybuf);
  if (source_tree()) {
    char src[4096];
    snprintf(src, sizeof src, "%s/python/umbp/tier.py", UMBP_SOURCE_ROOT);
    if (access(src, R_OK) == 0) {
      const char *old = getenv("PYTHONPATH");
      snprintf(pathbuf, sizeof pathbuf, "%s/python%s%s", UMBP_SOURCE_ROOT, old && *old ? ":" : "", old ? old : "");
      setenv("PYTHONPATH", pathbuf, 1);
    }
  }
  /* a missing package is said in one sentence, not a traceback; so is no
   * Ctrl-C that comes before the command installs its own handlers (Python's
   * start and the imports): exit 130, as a shell shows a C command's death by
   * SIGINT, not a KeyboardInterrupt traceback */
  char boot[1024];
  snprintf(boot, sizeof boot,
           "import sys\n"
           "try:\n"
           "    try:\n"
           "        from %s import main\n"
           "    except ImportError as e:\n"
           "        sys.exit(f'umbp %s: the umbp Python package is not importable by {sys.executable} ({e}): '\n"
           "                 'pip install umbp (pip install . in its repository), or set UMBP_PYTHON to a Python '\n"
           "                 'that has it')\n"
           "    sys.exit(main(sys.argv[1:]))\n"
           "except KeyboardInterrupt:\n"
           "    sys.exit(130)\n",
           module, what);
  char **args = calloc((size_t)argc + 4, sizeof *args);
  if (!args) {
    cli_error("%s: out of memory", what);
    return CLI_RUNTIME;
  }
  int k = 0;
  args[k++] = (char *)py;
  args[k++] = "-c";
  args[k++] = boot;
  for (int i = 1; i < argc; i++) args[k++] = argv[i];
  args[k] = NULL;
  fflush(NULL);
  execvp(py, args);
  int e = errno;
  free(args);
  cli_error("%s runs Python: cannot run '%s': %s (set UMBP_PYTHON to a Python 3 that has the umbp package and "
            "PyPI mooncake-transfer-engine-non-cuda)",
            what, py, strerror(e));
  return CLI_RUNTIME;
}

int cmd_tier(int argc, char **argv) { return run_module("tier", "umbp.tier_server", argc, argv); }

int cmd_bench_tier(int argc, char **argv) { return run_module("bench tier", "umbp.bench_tier", argc, argv); }
