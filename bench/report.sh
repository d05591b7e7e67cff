# SPDX-License-Identifier: Apache-2.0
# bench/report.sh — the end every benchmark's markdown table has; sourced by
# bench/gateway.sh, bench/distributed.sh and bench/growth.sh.

# The run's notes (expected by the configuration, but worth saying) and
# problems (anything unexpected), from the script's arrays notes and
# problems, as the table's last sections; nothing for an empty one.
print_notes_and_problems() {
    local p
    if ((${#notes[@]})); then
        printf '\n## Notes\n\n'
        for p in "${notes[@]}"; do printf -- '- %s\n' "$p"; done
    fi
    if ((${#problems[@]})); then
        printf '\n## Problems seen in this run\n\n'
        for p in "${problems[@]}"; do printf -- '- %s\n' "$p"; done
    fi
}
