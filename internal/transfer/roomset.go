package transfer

// roomSet is a bounded set of closed rooms, remembering which message
// types each had accepted: the decode side's replay table and the prefill
// side's tombstones. When full, the oldest room is forgotten (evictions
// are counted; a message for an evicted room is treated as for an unknown
// room, so the bound must exceed the rooms closed within the longest
// message delay).
type roomSet struct {
	limit   int
	seen    map[RoomID]uint16
	ring    []RoomID // insertion order, oldest at head
	head    int
	evicted uint64
}

func newRoomSet(limit int) *roomSet {
	return &roomSet{limit: limit, seen: make(map[RoomID]uint16, limit), ring: make([]RoomID, 0, limit)}
}

func (s *roomSet) has(r RoomID) (seen uint16, ok bool) {
	seen, ok = s.seen[r]
	return seen, ok
}

// add records r as closed with the types it had seen.
func (s *roomSet) add(r RoomID, seen uint16) {
	if _, ok := s.seen[r]; ok {
		s.seen[r] |= seen
		return
	}
	if len(s.ring) < s.limit {
		s.ring = append(s.ring, r)
	} else {
		delete(s.seen, s.ring[s.head])
		s.ring[s.head] = r
		s.head = (s.head + 1) % s.limit
		s.evicted++
	}
	s.seen[r] = seen
}

// mark adds type bits to a closed room.
func (s *roomSet) mark(r RoomID, bits uint16) {
	if v, ok := s.seen[r]; ok {
		s.seen[r] = v | bits
	}
}

func bit(t MsgType) uint16 { return 1 << t }
