package transfer

import "strings"

// Protections switches the isolation protections off, one by one, so that
// tests and the simulator can show each failure mode of DESIGN.md §1 is
// real and that each protection stops it. The zero value has every
// protection on; production never sets a field (the CLI's --unsafe-...
// flags do, loudly). Both machines and the pool's readers read the same
// struct; a protection a machine does not implement is ignored by it.
type Protections struct {
	// NoFenceCheck: the decode side does not compare page headers with the
	// expected fences on Done (and the engine skips kvpool.VerifyFences on
	// reads).
	NoFenceCheck bool
	// NoWindowRevocation: the decode side never revokes a window, so a
	// write posted before an abort can land after the pages were freed.
	NoWindowRevocation bool
	// NoDeferredRelease: on abort the decode side frees the pages at once
	// instead of holding them until Drained or quarantining them on timeout.
	NoDeferredRelease bool
	// NoTombstones: the prefill side forgets an aborted or finished room,
	// so a Grant or Prefill that arrives later (reordered or duplicated)
	// starts it again and posts writes. Drained then only means "nothing
	// in flight right now".
	NoTombstones bool
	// NoChecksum: the decode side does not verify page checksums on Done.
	NoChecksum bool
	// NoPageCountAgreement: neither side compares the granted page count
	// and prompt length with what was written: the decode side verifies
	// only the pages Done lists and starts with every granted page.
	NoPageCountAgreement bool
	// NoAdmissionBeforeReservation: the decode side reserves pages for a
	// prompt it should reject (clamped to the pool), and the prefill side
	// turns a request it rejects into a one-token placeholder that flows
	// through the normal path instead of sending Reject: "rejected but
	// alive".
	NoAdmissionBeforeReservation bool
}

// Safe reports whether every protection is on.
func (p Protections) Safe() bool { return p == Protections{} }

// String lists the protections that are off ("safe" when none is), in the
// words of the --unsafe-... flags.
func (p Protections) String() string {
	var off []string
	for _, f := range []struct {
		on   bool
		name string
	}{
		{p.NoFenceCheck, "fence-check"},
		{p.NoWindowRevocation, "window-revocation"},
		{p.NoDeferredRelease, "deferred-release"},
		{p.NoTombstones, "tombstones"},
		{p.NoChecksum, "checksum"},
		{p.NoPageCountAgreement, "page-count-agreement"},
		{p.NoAdmissionBeforeReservation, "admission-before-reservation"},
	} {
		if f.on {
			off = append(off, f.name)
		}
	}
	if len(off) == 0 {
		return "safe"
	}
	return "unsafe: no " + strings.Join(off, ", no ")
}
