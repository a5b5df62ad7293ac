package model

// Greedy generates up to n tokens after prompt for one sequence run alone:
// the whole prompt in one chunk, then one forward call per token over a
// private SliceStore, taking the highest logit (the lowest id on ties).
// When stop is non-nil, generation ends after the first token for which
// stop returns true (that token included). It shares nothing with the
// engine but Forward, so it is the plain reference that every served
// greedy output must equal (invariant I7). It is not fast: it allocates a
// workspace and a store per call.
func (m *Model) Greedy(prompt []int32, n int, stop func(id int32) bool) ([]int32, error) {
	const pageSize = 16
	pages := (len(prompt)+n)/pageSize + 1
	kv := NewSliceStore(m.Config, pageSize, pages)
	table := make([]int32, pages)
	for i := range table {
		table[i] = int32(i)
	}
	ws := m.NewWorkspace(max(len(prompt), 1), 1, 1)
	defer ws.Close()
	var out []int32
	seq := Seq{Tokens: prompt, Pages: table, Logits: LogitsLast}
	for len(out) < n {
		if err := m.Forward(ws, kv, []Seq{seq}); err != nil {
			return out, err
		}
		logits := ws.Logits(0, 0)
		best := int32(0)
		for i, v := range logits {
			if v > logits[best] {
				best = int32(i)
			}
		}
		out = append(out, best)
		if stop != nil && stop(best) {
			break
		}
		seq = Seq{Tokens: []int32{best}, Pos: seq.Pos + len(seq.Tokens), Pages: table, Logits: LogitsLast}
	}
	return out, nil
}
