#!/bin/sh
# `epinfer generate` with layout flags, started outside MPI (it relaunches itself under mpirun): the same
# greedy tokens as one rank, the --json object printed exactly once, one weight-bytes line per rank on
# stderr; an invalid layout is one error line with the numbers, before any rank starts; an error inside the
# ranks (no weights) is that one line too, without Open MPI's boxed non-zero-exit report.
#   generate_cli_test.sh EPINFER FIXTURE_DIR
set -u
epinfer=$1
model=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
run() {  # run NAME FLAGS...
    name=$1; shift
    "$epinfer" generate --model "$model" --prompt-ids 5,17,33,2,9 --max-new-tokens 6 --ignore-eos --json "$@" \
        >"$out/$name.out" 2>"$out/$name.err" || fail "$name: exit status $? ($(cat "$out/$name.err"))"
}
run one
want=$(sed 's/.*"output_ids":\(\[[^]]*\]\).*/\1/' "$out/one.out")
for layout in "2|--tp 2" "2|--ep 2" "2|--dp 2 --ep 2" "2|--pp 2" "4|--pp 2 --ep 2"; do
    ranks=${layout%%|*}
    flags=${layout#*|}
    # shellcheck disable=SC2086
    run layout $flags
    [ "$(wc -l <"$out/layout.out")" -eq 1 ] || fail "$flags: stdout has $(wc -l <"$out/layout.out") lines, not 1"
    got=$(sed 's/.*"output_ids":\(\[[^]]*\]\).*/\1/' "$out/layout.out")
    [ "$got" = "$want" ] || fail "$flags: output_ids $got, one rank $want"
    lines=$(grep -c "weight bytes" "$out/layout.err")
    [ "$lines" -eq "$ranks" ] || fail "$flags: $lines weight-bytes lines on stderr, not $ranks"
    echo "ok: $flags -> $got"
done
"$epinfer" generate --model "$model" --prompt-ids 5,17 --tp 3 >"$out/bad.out" 2>"$out/bad.err" && fail "--tp 3 succeeded"
[ "$(wc -l <"$out/bad.err")" -eq 1 ] || fail "--tp 3: $(wc -l <"$out/bad.err") stderr lines, not 1"
grep -q "^epinfer: error: parallel layout .*num_attention_heads 4 is not divisible by attn_tp 3" "$out/bad.err" \
    || fail "--tp 3: unexpected message: $(cat "$out/bad.err")"
echo "ok: --tp 3 rejected: $(cat "$out/bad.err")"
mkdir "$out/noweights" && cp "$model/config.json" "$out/noweights/"
"$epinfer" generate --model "$out/noweights" --prompt-ids 5,17 --tp 2 >"$out/nw.out" 2>"$out/nw.err" \
    && fail "--tp 2 without weights succeeded"
[ "$(wc -l <"$out/nw.err")" -eq 1 ] || fail "--tp 2 without weights: $(wc -l <"$out/nw.err") stderr lines, not 1: $(cat "$out/nw.err")"
grep -q "^epinfer: error: .*noweights: no model weights: neither" "$out/nw.err" \
    || fail "--tp 2 without weights: unexpected message: $(cat "$out/nw.err")"
echo "ok: --tp 2 without weights: $(cat "$out/nw.err")"
