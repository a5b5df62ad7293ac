// Package sim is a deterministic simulator of the KV transfer protocol: the
// real prefill and decode machines of internal/transfer over real
// internal/kvpool pools, driven by one seeded event scheduler that plays
// the network, the engines, the router and the clients.
//
// The scheduler reorders, delays, drops and duplicates control messages;
// lets posted page writes land late, after aborts (a posted write cannot be
// cancelled), applying them only through the decode worker's
// transfer.WindowTable as a NIC would; crashes and restarts workers and
// resets connections (each is a new connection epoch, announced with
// PeerEpoch); aborts requests at random moments; and uses tiny pools so that
// pages are reused constantly. Page contents are synthetic but checkable:
// every token's K/V is derived from (request, position), so a read of
// another request's data, or of data never written, is detected.
//
// After every event the simulator checks I1–I5 of DESIGN.md §5 and that
// every request ends exactly once, with its complete and correct prompt KV
// or with an error. A run is a pure function of its Config: the seed alone
// replays it (Config.Trace then shows every event).
package sim
