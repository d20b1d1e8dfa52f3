#!/bin/bash
# Several hosts on one machine: two network namespaces ("hosts" A and B) joined by a veth
# pair with private addresses that exist only inside them. The launcher runs in A with a
# hostfile naming both addresses (2 slots each); mpirun's rsh agent is a small script that
# runs the remote command inside the namespace of the address it is given, as ssh would on
# another machine. A 2-host data-parallel job (2 workers per host) and a 2-host pipeline
# (stages 0-1 on A, 2-3 on B) must match one worker's losses within 1e-5 relative, and every
# worker must have reached the coordinator over the veth addresses.
# Usage: multihost_test.sh LAUNCHER. Needs root and iproute2; skips, saying why, otherwise.
set -u
. "$(dirname "$0")/../tools/junit.sh"  # check, fail, skip; the checks as JUnit XML
launcher="$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export TMPDIR="$tmp"  # Open MPI's session files stay in the test's directory
small=(--model=gpt --n-layer=2 --d-model=32 --n-head=2 --seq-len=16 --batch=8 --steps=6)

[ "$(id -u)" -eq 0 ] || skip "creating network namespaces needs root (running as uid $(id -u))"
command -v ip >/dev/null 2>&1 || skip "no 'ip' command: install iproute2 (tools/setup.sh does)"

# Names unique to this run; the subnet exists only inside the two namespaces.
id=$(( ($$ + RANDOM) % 100000 ))
while ip netns list 2>/dev/null | grep -q "^tnd${id}[ab]\b"; do id=$(( (id + 1) % 100000 )); done
ns_a="tnd${id}a"
ns_b="tnd${id}b"
net=$(( id % 250 + 1 ))
addr_a="10.231.$net.1"
addr_b="10.231.$net.2"

cleanup() {
  for ns in "$ns_a" "$ns_b"; do
    if ip netns list 2>/dev/null | grep -q "^$ns\b"; then
      # Whatever this test started inside the namespace (orted, workers) goes with it.
      for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
      ip netns del "$ns" 2>/dev/null
    fi
  done
}
on_exit cleanup

if ! ip netns add "$ns_a" 2>"$tmp/netns.err"; then
  skip "cannot create a network namespace: $(cat "$tmp/netns.err")"
fi
check "two hosts: network namespaces joined by a veth pair"
ip netns add "$ns_b" || fail "cannot create namespace $ns_b"
ip link add "tv${id}a" type veth peer name "tv${id}b" || fail "cannot create a veth pair"
ip link set "tv${id}a" netns "$ns_a" && ip link set "tv${id}b" netns "$ns_b" ||
  fail "cannot move the veth ends into the namespaces"
ip -n "$ns_a" addr add "$addr_a/24" dev "tv${id}a" &&
  ip -n "$ns_b" addr add "$addr_b/24" dev "tv${id}b" &&
  ip -n "$ns_a" link set "tv${id}a" up && ip -n "$ns_b" link set "tv${id}b" up &&
  ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up || fail "cannot set up the veth pair"
echo "hosts: $addr_a (namespace $ns_a), $addr_b (namespace $ns_b)"

# mpirun's rsh agent: "agent HOST COMMAND..." runs COMMAND in HOST's namespace, as ssh would
# run it on HOST (through a shell).
agent="$tmp/netns-agent.sh"
cat >"$agent" <<EOF
#!/bin/sh
host="\$1"
shift
echo "\$host: \$*" >>"$tmp/agent.log"
case "\$host" in
  $addr_a) ns=$ns_a ;;
  $addr_b) ns=$ns_b ;;
  *) echo "netns agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
EOF
chmod +x "$agent"
printf '%s slots=2\n%s slots=2\n' "$addr_a" "$addr_b" >"$tmp/hosts"
mpirun_args="--mca plm_rsh_agent $agent --mca plm_rsh_no_tree_spawn 1 --mca btl self,tcp"
mpirun_args+=" --mca btl_tcp_if_include 10.231.$net.0/24 --mca oob_tcp_if_include 10.231.$net.0/24"

losses() {  # run dir: run.json's losses, one per line
  sed -n 's/^ *"losses": \[\(.*\)\],$/\1/p' "$1/run.json" | tr ',' '\n' | tr -d ' '
}

# The reference: one worker, on this host.
check "one worker's losses, the reference"
ref="$tmp/run-one"
timeout 120 "$launcher" --strategy=data --gpus=1 "${small[@]}" --run-dir="$ref" \
  >"$tmp/out-one.txt" 2>&1 || { cat "$tmp/out-one.txt"; fail "the one-worker run failed"; }
[ "$(losses "$ref" | grep -c .)" -eq 6 ] || fail "the one-worker run has no 6 losses"

check_two_hosts() {  # strategy
  local strategy="$1" dir="$tmp/run-$1" out="$tmp/out-$1.txt" start end
  check "--strategy=$strategy on 2 hosts x 2 workers matches one worker"
  start=$(date +%s)
  timeout 180 ip netns exec "$ns_a" "$launcher" --strategy="$strategy" --gpus=4 "${small[@]}" \
    --run-dir="$dir" --hostfile="$tmp/hosts" --mpirun-args="$mpirun_args" >"$out" 2>&1
  local rc=$?
  end=$(date +%s)
  cat "$out"
  [ "$rc" -eq 0 ] || { cat "$dir/logs/mpirun.log" 2>/dev/null; fail "--strategy=$strategy on 2 hosts exited $rc"; }
  grep -q "coordinator at $addr_a" "$out" || fail "the coordinator is not on $addr_a"
  # Parity with one worker.
  paste <(losses "$ref") <(losses "$dir") | awk -v s="$strategy" '
    { n++; d = $1 - $2; if (d < 0) d = -d; m = $1 < 0 ? -$1 : $1;
      if (d > 1e-5 * m) { printf "step %d: one worker %s, %s on 2 hosts %s\n", n - 1, $1, s, $2; bad = 1 } }
    END { if (n != 6) { print "expected 6 losses, got " n; bad = 1 } exit bad }' ||
    fail "--strategy=$strategy on 2 hosts does not match one worker"
  # Every rank reached the coordinator over the veth pair: ranks 0-1 from A, 2-3 from B.
  cat "$dir/logs/coordinator.log"
  for r in 0 1; do
    grep -q "^rank $r registered from ipv4:$addr_a:" "$dir/logs/coordinator.log" ||
      fail "rank $r did not register from $addr_a"
  done
  for r in 2 3; do
    grep -q "^rank $r registered from ipv4:$addr_b:" "$dir/logs/coordinator.log" ||
      fail "rank $r did not register from $addr_b"
  done
  for r in 0 1 2 3; do
    grep -q "coordinator $addr_a:" "$dir/logs/rank-$r.log" ||
      fail "rank $r was not told the coordinator at $addr_a"
  done
  grep -q "^$addr_b: .*orted" "$tmp/agent.log" || fail "mpirun did not start $addr_b through the agent"
  # Nothing of the job is left in either namespace.
  sleep 1
  for ns in "$ns_a" "$ns_b"; do
    left="$(ip netns pids "$ns")"
    [ -z "$left" ] || { ps -o pid,cmd -p $left >&2; fail "processes left in $ns: $left"; }
  done
  echo "PASSED: --strategy=$strategy, 2 hosts x 2 workers, matches one worker ($((end - start)) s)"
}

check_two_hosts data
check_two_hosts pipeline
echo "PASSED: multi-host data parallel and pipeline over $addr_a / $addr_b"
