package transfer

import (
	"fmt"

	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/reqerr"
)

// RoomID names one transfer session (one request, one prefill, one
// decode): 128 random bits minted by the router with crypto/rand. The
// machines take rooms as inputs and never mint them.
type RoomID = kvpool.RoomID

// Fence is the (room, epoch) pair a page is granted under.
type Fence = kvpool.Fence

// PeerID names a worker (or the router) to the transport. The machines
// address messages by PeerID; the driver maps ids to connections.
type PeerID uint32

// WindowKey names one window: the pages one decode machine lets one
// prefill write for one room. Keys are never reused by a decode machine
// (KeyBase + a counter), so a revoked key can never be reopened.
type WindowKey uint64

// MsgType is the type byte of a frame. Values travel on the wire: append,
// never renumber.
type MsgType uint8

const (
	TypeOpen      MsgType = 1 // router -> decode: start a room
	TypePrefill   MsgType = 2 // router -> prefill: start a room
	TypeGrant     MsgType = 3 // decode -> prefill: pages, fences, window key, agreed count and length
	TypeReject    MsgType = 4 // either way: the room cannot be served, with the original error
	TypeWrite     MsgType = 5 // prefill -> decode data path: one page (header + K/V)
	TypeDone      MsgType = 6 // prefill -> decode: every page written and landed
	TypeAbort     MsgType = 7 // router or decode -> prefill, router -> decode
	TypeDrained   MsgType = 8 // prefill -> decode: nothing in flight, room tombstoned
	TypePeerEpoch MsgType = 9 // transport -> machine: the connection to Peer is new
	typeLimit             = 10
)

var typeNames = [typeLimit]string{"", "Open", "Prefill", "Grant", "Reject", "Write", "Done", "Abort", "Drained", "PeerEpoch"}

func (t MsgType) String() string {
	if t > 0 && t < typeLimit {
		return typeNames[t]
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// MACSize is the length of a message authentication code: HMAC-SHA256
// truncated to 128 bits.
const MACSize = 16

// Envelope is what every message carries: its room and the MAC that
// authenticates the whole message (see Auth).
type Envelope struct {
	Room RoomID
	MAC  [MACSize]byte
}

// Env returns the envelope; it is how code reaches the room and MAC of any
// Message.
func (e *Envelope) Env() *Envelope { return e }

// Message is one of *Open, *Prefill, *Grant, *Reject, *Write, *Done,
// *Abort, *Drained, *PeerEpoch. A message MUST NOT be modified after it is
// signed; machines never modify the messages they receive, so one message
// value may be delivered any number of times (the simulator duplicates).
type Message interface {
	Type() MsgType
	Env() *Envelope
	String() string
}

// Open asks a decode machine to serve a room: admit it, allocate pages for
// the prompt, open a window for Prefill and grant it.
type Open struct {
	Envelope
	Prefill      PeerID // the prefill worker that will write the pages
	PromptTokens uint32
	MaxTokens    uint32
}

// Prefill asks a prefill machine to compute a room's prompt KV and write it
// to Decode's pages once Decode grants them. The prompt tokens themselves
// travel beside the message (the machine never sees tenant data).
type Prefill struct {
	Envelope
	Decode       PeerID
	PromptTokens uint32
	MaxTokens    uint32
}

// Grant gives a prefill machine the pages to write: Pages[i] under fence
// (Room, Epochs[i]) through window Key. PageCount and PromptTokens are the
// agreement both sides check (page-count agreement): the prefill side
// refuses a grant that does not match its own count.
type Grant struct {
	Envelope
	Key          WindowKey
	PromptTokens uint32
	PageCount    uint32
	Pages        []int32
	Epochs       []uint64
}

// Reject says a room cannot be served. It carries the original error as a
// kind plus numbers (never text), so a *reqerr.ContextLengthError reaches
// the client as itself. A Reject from the prefill side also promises that
// the prefill side never wrote and never will write for the room.
type Reject struct {
	Envelope
	Kind      reqerr.Kind
	Prompt    uint32
	MaxTokens uint32
	Limit     uint32
}

// Err rebuilds the original error.
func (r *Reject) Err() error {
	if r.Kind == reqerr.KindContextLength {
		return &reqerr.ContextLengthError{Prompt: int(r.Prompt), MaxTokens: int(r.MaxTokens), Limit: int(r.Limit)}
	}
	return reqerr.New(r.Kind, "room %v rejected", r.Room)
}

// Write is one page write on the data path: Header (fence, page id,
// ordinal, token count, checksum) then Data (the K/V bytes) land in page
// Page of the decode pool if window Key is open and holds Page. The MAC
// covers everything but Data; Data is covered by the header's checksum.
// Data aliases the sender's pool page until the write is reported landed.
type Write struct {
	Envelope
	Key    WindowKey
	Page   int32
	Header [kvpool.HeaderSize]byte
	Data   []byte
}

// Done says every page was written and every write has landed (the prefill
// side sends it only when the transport acknowledged all of them).
type Done struct {
	Envelope
	Pages      uint32   // pages written
	Tokens     uint32   // prompt tokens written
	Checksums  []uint32 // per page, in ordinal order
	FirstToken int32    // the token sampled from the last prompt position
}

// Abort ends a room early (client gone, timeout, shutdown). Decode names
// the room's decode worker so that a prefill machine that never heard of
// the room still knows where to send Drained.
type Abort struct {
	Envelope
	Reason reqerr.Kind
	Decode PeerID
}

// Drained is the prefill side's answer to an Abort: every write it posted
// for the room has been acknowledged by the transport, AND it has
// tombstoned the room, so it will never post another write for it even if
// a Grant or a chunk for it arrives later.
type Drained struct {
	Envelope
}

// PeerEpoch tells a machine that its connection to Peer is now Epoch
// (strictly increasing): the previous connection is closed and no write
// sent through it can still land. The transport delivers it; its Room is
// zero.
type PeerEpoch struct {
	Envelope
	Peer  PeerID
	Epoch uint64
}

func (*Open) Type() MsgType      { return TypeOpen }
func (*Prefill) Type() MsgType   { return TypePrefill }
func (*Grant) Type() MsgType     { return TypeGrant }
func (*Reject) Type() MsgType    { return TypeReject }
func (*Write) Type() MsgType     { return TypeWrite }
func (*Done) Type() MsgType      { return TypeDone }
func (*Abort) Type() MsgType     { return TypeAbort }
func (*Drained) Type() MsgType   { return TypeDrained }
func (*PeerEpoch) Type() MsgType { return TypePeerEpoch }

func (m *Open) String() string {
	return fmt.Sprintf("Open room=%v prefill=%d prompt=%d max=%d", m.Room, m.Prefill, m.PromptTokens, m.MaxTokens)
}
func (m *Prefill) String() string {
	return fmt.Sprintf("Prefill room=%v decode=%d prompt=%d max=%d", m.Room, m.Decode, m.PromptTokens, m.MaxTokens)
}
func (m *Grant) String() string {
	return fmt.Sprintf("Grant room=%v key=%d prompt=%d count=%d pages=%v epochs=%v", m.Room, m.Key, m.PromptTokens, m.PageCount, m.Pages, m.Epochs)
}
func (m *Reject) String() string {
	return fmt.Sprintf("Reject room=%v kind=%v prompt=%d max=%d limit=%d", m.Room, m.Kind, m.Prompt, m.MaxTokens, m.Limit)
}
func (m *Write) String() string {
	h, err := kvpool.ParseHeader(m.Header[:])
	if err != nil {
		return fmt.Sprintf("Write room=%v key=%d page=%d header=bad", m.Room, m.Key, m.Page)
	}
	return fmt.Sprintf("Write room=%v key=%d page=%d fence=%v ord=%d tokens=%d", m.Room, m.Key, m.Page, h.Fence, h.Ordinal, h.Tokens)
}
func (m *Done) String() string {
	return fmt.Sprintf("Done room=%v pages=%d tokens=%d sums=%d first=%d", m.Room, m.Pages, m.Tokens, len(m.Checksums), m.FirstToken)
}
func (m *Abort) String() string {
	return fmt.Sprintf("Abort room=%v reason=%v decode=%d", m.Room, m.Reason, m.Decode)
}
func (m *Drained) String() string { return fmt.Sprintf("Drained room=%v", m.Room) }
func (m *PeerEpoch) String() string {
	return fmt.Sprintf("PeerEpoch peer=%d epoch=%d", m.Peer, m.Epoch)
}
