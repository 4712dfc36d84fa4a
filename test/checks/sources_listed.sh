#!/usr/bin/env bash
# The build list (sources.txt) names every source file of the build once,
# in the part its folder belongs to (src/core: core, src/pg: module,
# src/relay: relay), and nothing that does not exist: a file left out would
# not be built by either build, the module then failing only when loaded.
set -u
cd "$(dirname "$0")/../.."
status=0
declare -A part_of=([core]=src/core [module]=src/pg [relay]=src/relay)
for part in core module relay; do
    listed=$(sed -n "/^\[$part\]/,/^\[/{/^src\//p}" sources.txt | sort)
    present=$(find "${part_of[$part]}" -name '*.cpp' | sort)
    missing=$(comm -13 <(echo "$listed") <(echo "$present"))
    stale=$(comm -23 <(echo "$listed") <(echo "$present"))
    repeated=$(sed -n "/^\[$part\]/,/^\[/{/^src\//p}" sources.txt | sort | uniq -d)
    for f in $missing; do echo "sources.txt: [$part] does not list $f"; status=1; done
    for f in $stale; do echo "sources.txt: [$part] lists $f, which is not a source of ${part_of[$part]}"; status=1; done
    for f in $repeated; do echo "sources.txt: [$part] lists $f twice"; status=1; done
done
echo "sources_listed: $([ $status -eq 0 ] && echo "every source listed once" || echo "the list is off")"
exit $status
