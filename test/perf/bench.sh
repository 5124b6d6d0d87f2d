# Shared by test/perf/peers, ab, hops, kcalls and usercost (sourced): one measurement is a server and a client
# started for it alone; each key collects a number per round; a row shows the median. The caller
# sets T (seconds a process may run).

# pair SERVER_CMD -- CLIENT_CMD: starts the server, gives it a second, runs the client (its output
# on stdout), stops the server. Each tool's server exits by itself after one client but ibmsg-perf's.
pair() {
  local srv=() cli=() s out
  while [ "$1" != -- ]; do srv+=("$1"); shift; done
  shift
  cli=("$@")
  timeout $T "${srv[@]}" >/dev/null 2>&1 & s=$!
  sleep 1
  out=$(timeout $T "${cli[@]}" 2>&1)
  kill -TERM "$s" 2>/dev/null
  wait "$s" 2>/dev/null
  echo "$out"
}
declare -A V
add() { [[ $2 =~ ^[0-9]+(\.[0-9]*)?$ ]] && V[$1]="${V[$1]:-} $2"; return 0; }
# med: the median of the numbers on stdin (space- or line-separated), nothing for none.
med() {
  awk '{ for (i = 1; i <= NF; i++) a[++n] = $i } END { if (!n) exit
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    print (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }'
}
median() { echo "${V[$1]:-}" | med; }

# paired KEY REF_KEY: the median of the rounds' own ratios KEY / REF_KEY (each round's two
# measurements ran a few seconds apart, so a host that slows down for a while moves both), or
# nothing when a round lacks either number.
paired() {
  local r
  r=$(awk -v a="${V[$1]:-}" -v b="${V[$2]:-}" 'BEGIN { n = split(a, x, " ")
    if (!n || n != split(b, y, " ")) exit
    for (i = 1; i <= n; i++) if (y[i] + 0 <= 0) exit
    for (i = 1; i <= n; i++) print x[i] / y[i] }')
  [ -n "$r" ] && printf '%.2f\n' "$(echo "$r" | med)"
  return 0
}

# col N: column N of the first row that starts with a number (the result rows of perftest and
# ibmsg-perf start with the size).
col() { awk -v c="$1" '$1 ~ /^[0-9]+$/ && NF >= c { print $c; exit }'; }
# m KEY PARSER SERVER_CMD -- CLIENT_CMD: one measurement, tried once more when it gave no number
# (a client quicker than its server, say).
m() {
  local key=$1 parse=$2 v try
  shift 2
  for try in 1 2; do
    v=$(pair "$@" | $parse)
    [ -n "$v" ] && break
  done
  add "$key" "$v"
}

# rawpp_build DIR TOOL: test/perf/rawpp (a raw-verbs ping-pong with ibmsg's verbs choices) built
# afresh as DIR/rawpp, once: on the host before a script runs itself in the VM, or in the VM when
# it runs there directly (RAWPP_BUILT, exported, says it is done). TOOL names the script in the
# message when it cannot be built (the script then leaves rawpp out).
rawpp_build() {
  [ -n "${RAWPP_BUILT:-}" ] && return 0
  mkdir -p "$1" && rm -f "$1/rawpp" || exit 1
  ${CC:-cc} -std=gnu11 -O2 -g -o "$1/rawpp" "$(dirname "${BASH_SOURCE[0]}")/rawpp.c" -lrdmacm -libverbs ||
    echo "$2: cannot build test/perf/rawpp (libibverbs-dev and librdmacm-dev): it is left out"
  export RAWPP_BUILT=1
}
