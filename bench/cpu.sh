# SPDX-License-Identifier: Apache-2.0
# bench/cpu.sh — where the CPU went during a measurement, from /proc; sourced
# by bench/gateway.sh and bench/distributed.sh. On a small machine the load
# generator, the servers and whatever else runs share the cores, so every
# figure is read next to these.

# Sum of utime + stime, in clock ticks, of every process in the groups "$@".
group_ticks() {
    local gs=" $* " f line rest t=0 a
    for f in /proc/[0-9]*/stat; do
        line=$(<"$f") 2>/dev/null || continue
        rest=${line##*) } # fields from 3 (state) on
        read -r -a a <<<"$rest"
        # a[0]=state(3) a[1]=ppid(4) a[2]=pgrp(5) ... a[11]=utime(14) a[12]=stime(15)
        [[ $gs == *" ${a[2]} "* ]] && t=$((t + a[11] + a[12]))
    done 2>/dev/null
    echo "$t"
}
# The same for the processes "$@" and their children, for a server that is
# not one process group (PostgreSQL's backends each start a session of their
# own), named by its main process. A child that exited and was reaped is
# in its parent's cutime + cstime: counted there.
tree_ticks() {
    local ps=" $* " f line rest t=0 a pid
    for f in /proc/[0-9]*/stat; do
        line=$(<"$f") 2>/dev/null || continue
        rest=${line##*) }
        read -r -a a <<<"$rest"
        pid=${line%% *}
        # a[13]=cutime(16) a[14]=cstime(17)
        if [[ $ps == *" $pid "* ]]; then
            t=$((t + a[11] + a[12] + a[13] + a[14]))
        elif [[ $ps == *" ${a[1]} "* ]]; then
            t=$((t + a[11] + a[12]))
        fi
    done 2>/dev/null
    echo "$t"
}
clk_tck=$(getconf CLK_TCK)

# Busy (non-idle, non-iowait) ticks of the whole machine, all CPUs.
machine_ticks() {
    awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat
}
