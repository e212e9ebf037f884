#!/usr/bin/env bash
# The README's two commands: `bash dev.sh demo` and `bash dev.sh test`.
# Both work on a fresh machine with only Python 3.11 and pip: they create .venv first.
set -euo pipefail
cd "$(dirname "$0")"

# The venv comes from the system's Python 3.11 when there is one: other users (the tests run
# clients as `nobody`) cannot read an interpreter kept in root's home.
if [ -z "${PYTHON:-}" ] && [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import ensurepip' 2>/dev/null; then
    PY=/usr/bin/python3
else
    PY=${PYTHON:-python3}
fi
VENV=.venv

setup() {
    if [ ! -x "$VENV/bin/python" ]; then
        "$PY" -m venv "$VENV"
    fi
    # Installed already from this very pyproject.toml: nothing to do (and nothing printed).
    local stamp="$VENV/.gridgate-installed"
    local want
    want=$(sha256sum pyproject.toml | cut -d' ' -f1)
    if [ -x "$VENV/bin/gridgate" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        return 0
    fi
    # pip's own output (its config warnings, setuptools' editable-install notice) goes to a log,
    # read when the install fails: a person needs one line saying what takes this long
    local log="$VENV/pip-install.log"
    echo "dev.sh: installing gridgate and its test tools into $VENV (pip's output: $log)" >&2
    if ! { "$VENV/bin/python" -m pip install --upgrade pip \
            && "$VENV/bin/python" -m pip install -e ".[test]"; } >"$log" 2>&1; then
        echo "dev.sh: pip install failed; the end of $log:" >&2
        tail -n 20 "$log" >&2
        exit 1
    fi
    echo "$want" > "$stamp"
}

ARC_PACKAGES=(nordugrid-arc-arex nordugrid-arc-client nordugrid-arc-arcctl
              nordugrid-arc-plugins-arcrest nordugrid-arc-plugins-needed)

apt_install() {
    # apt_install WHAT PACKAGE...: Debian packages, quietly. Some postinsts start a system service
    # through invoke-rc.d (nordugrid-arc-arex an A-REX on port 443, gridengine-master and -exec a
    # cell under /var/lib/gridengine); the tests start private ones, so a machine without a
    # policy-rc.d gets a temporary one that denies every start, removed however the install ends.
    local what=$1
    shift
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    echo "dev.sh: installing $* (Debian packages) for $what" >&2
    (
        policy=/usr/sbin/policy-rc.d
        if [ ! -e "$policy" ]; then
            trap '$sudo rm -f "$policy"' EXIT
            printf '#!/bin/sh\n# dev.sh: no service may start while it installs packages\nexit 101\n' \
                | $sudo tee "$policy" >/dev/null
            $sudo chmod 755 "$policy"
        fi
        $sudo apt-get update -qq \
            && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
                   --no-install-recommends "$@"
    ) >/dev/null 2>&1 \
        || echo "dev.sh: could not install $*; the tests that need them will fail" >&2
}

need_service() {
    # need_service slurm|arc|sge: only what that private service needs (`up` installs no
    # test tool it does not use)
    local missing=() pair pairs
    case "$1" in
        slurm) pairs="munged:munge slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client" ;;
        sge) pairs="sge_qmaster:gridengine-master sge_execd:gridengine-exec qsub:gridengine-client" ;;
        arc) pairs="openssl:openssl" ;;
    esac
    for pair in $pairs; do
        PATH="$PATH:/usr/sbin:/sbin" command -v "${pair%%:*}" >/dev/null 2>&1 \
            || missing+=("${pair##*:}")
    done
    if [ "$1" = arc ] && { ! PATH="$PATH:/usr/sbin:/sbin" command -v arcsub >/dev/null 2>&1 \
            || ! PATH="$PATH:/usr/sbin:/sbin" command -v arched >/dev/null 2>&1; }; then
        apt_install "the private ARC CE" "${ARC_PACKAGES[@]}"
    fi
    [ ${#missing[@]} -eq 0 ] && return 0
    apt_install "the private $1" "${missing[@]}"
}

need_tools() {
    # Real parts the tests start or call, from Debian's packages: redis-server (the redis
    # driver), openssl (test certificates), setpriv (clients as another uid), chattr (a
    # read-only state file as root), systemd-analyze (the unit files), and a real Slurm for the
    # private cluster the Slurm tests start (munged, slurmctld, slurmd, the client commands),
    # and a real Grid Engine for the private cell the sge tests start (plugins/sge/cell.py),
    # and sudo (a ban run through a real sudo records who ran it), and Prometheus (promtool
    # checks and tests deploy/prometheus/gridgate-rules.yml; a real server scrapes a director),
    # and PostgreSQL's server binaries (the postgresql driver's tests start a private cluster
    # with them: tests/support/postgres_server.py), and a C compiler with the C library's headers
    # (the compiled shims of `gridgate gate --install-shims`: plugins/lsf_proxy/gate/shim.c).
    local missing=()
    local pair
    for pair in redis-server:redis-server openssl:openssl setpriv:util-linux \
                chattr:e2fsprogs systemd-analyze:systemd munged:munge slurmctld:slurmctld \
                slurmd:slurmd sbatch:slurm-client sge_qmaster:gridengine-master \
                sge_execd:gridengine-exec qsub:gridengine-client sudo:sudo \
                promtool:prometheus prometheus:prometheus cc:gcc; do
        PATH="$PATH:/usr/sbin:/sbin" command -v "${pair%%:*}" >/dev/null 2>&1 \
            || missing+=("${pair##*:}")
    done
    # gcc only recommends the headers; --no-install-recommends leaves them out
    [ -e /usr/include/stdio.h ] || missing+=(libc6-dev)
    # initdb is not on PATH: Debian keeps each version's server in /usr/lib/postgresql/VER/bin
    if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
        missing+=(postgresql)
    fi
    # The private ARC CE of the ARC tests (plugins/arc/ce.py): A-REX, the client, arcctl.
    if ! PATH="$PATH:/usr/sbin:/sbin" command -v arcsub >/dev/null 2>&1 \
            || ! PATH="$PATH:/usr/sbin:/sbin" command -v arched >/dev/null 2>&1; then
        apt_install "the ARC tests" "${ARC_PACKAGES[@]}"
    fi
    [ ${#missing[@]} -eq 0 ] && return 0
    apt_install "the tests" "${missing[@]}"
}

typecheck() {
    # mypy over the whole package, then bench/, under the package's real names
    # (core/devkit/typecheck.py says how); silent when clean
    "$VENV/bin/python" -m gridgate.core.devkit.typecheck "$@"
}

case "${1:-}" in
    typecheck)
        # mypy alone (dev.sh test runs it too); extra arguments go to mypy
        shift
        setup
        typecheck "$@"
        ;;
    demo)
        shift
        setup
        exec "$VENV/bin/gridgate" demo "$@"
        ;;
    test)
        shift
        setup
        need_tools
        # The checks that need no test first, quiet when all is well: lint, format (STYLE.md),
        # types. The layering rules are a test (tests/test_layering.py), run with the rest.
        "$VENV/bin/ruff" check -q core plugins demo tests bench examples
        "$VENV/bin/ruff" format --check -q core plugins demo tests bench examples
        typecheck
        # the 25 slowest tests are listed at the end: the suite's budget is about 20 minutes
        # on 2 cores, and this is where to look when it grows
        exec "$VENV/bin/python" -m pytest -n 2 -q --durations=25 "$@"
        ;;
    slurm)
        # A private one-node Slurm cluster for people, the demo and the benches:
        # `bash dev.sh slurm up` prints the SLURM_CONF to export; `stop` and `start` keep its
        # jobs, name and ports; `bash dev.sh slurm down` cancels them and stops it.
        shift
        setup
        need_service slurm
        exec "$VENV/bin/python" -m gridgate.plugins.slurm.cluster "${@:-up}"
        ;;
    arc)
        # A private ARC CE (A-REX, fork or Slurm LRMS) for people, the demo and the benches:
        # `bash dev.sh arc up [DIR]` prints the variables to export; `stop` and `start` keep its
        # jobs, port and issuer; `bash dev.sh arc down [DIR]` cancels a Slurm CE's jobs too.
        shift
        setup
        need_service arc
        exec "$VENV/bin/python" -m gridgate.plugins.arc.ce "${@:-up}"
        ;;
    sge)
        # A private Grid Engine cell (sge_qmaster, sge_execd) for people, the demo and the benches:
        # `bash dev.sh sge up [DIR]` prints the variables to export; `stop` and `start` keep its
        # jobs; `bash dev.sh sge down [DIR]` stops it and its jobs.
        shift
        setup
        need_service sge
        exec "$VENV/bin/python" -m gridgate.plugins.sge.cell "${@:-up}"
        ;;
    *)
        echo "usage: bash dev.sh demo | bash dev.sh test [pytest args] | bash dev.sh typecheck [mypy args] | bash dev.sh slurm up|down|stop|start|env [--folder DIR] | bash dev.sh arc up|stop|start|down|env|status|user [DIR] | bash dev.sh sge up|stop|start|down|env [DIR]" >&2
        exit 64
        ;;
esac
