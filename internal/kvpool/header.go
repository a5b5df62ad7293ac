package kvpool

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
)

// HeaderSize is the size of a page header in bytes; page data starts at
// this offset. 64 bytes keeps the data cache-line aligned.
const HeaderSize = 64

// Header layout (little-endian):
//
//	0  u32  magic "KVFP"
//	4  u16  version
//	6  u16  flags
//	8  [16] fence room
//	24 u64  fence epoch
//	32 i32  page id the header was written for
//	36 u32  ordinal: position of the page in its sequence's page table
//	40 u32  tokens: token slots of this page that hold data
//	44 u32  checksum (CRC-32 IEEE), valid when FlagChecksum is set
//	48 [16] reserved, zero
const (
	headerMagic   = 0x5046564B // "KVFP"
	headerVersion = 1

	offMagic    = 0
	offVersion  = 4
	offFlags    = 6
	offRoom     = 8
	offEpoch    = 24
	offPage     = 32
	offOrdinal  = 36
	offTokens   = 40
	offChecksum = 44
	offReserved = 48
)

// Header flags.
const (
	// FlagChecksum says the checksum field is valid. A header without it
	// fails VerifyChecksum: a missing checksum is a failure, not a skip.
	FlagChecksum uint16 = 1 << 0
	// FlagTransfer marks a header sealed for a transfer (Seal).
	FlagTransfer uint16 = 1 << 1
	// FlagLocal marks a header stamped by the page's owner (Stamp).
	FlagLocal uint16 = 1 << 2

	knownFlags = FlagChecksum | FlagTransfer | FlagLocal
)

// RoomID names one transfer session: one request, one prefill, one decode.
// It is 128 random bits minted by the router (crypto/rand); the pool only
// compares it.
type RoomID [16]byte

// String returns the first 8 bytes in hex: enough to tell rooms apart in
// logs, and the id is random, never tenant data.
func (r RoomID) String() string { return hex.EncodeToString(r[:8]) }

// Fence is the pair a page is granted under. The writer stamps it into the
// header; every reader compares it with the fence the pool recorded at
// allocation before using the page.
type Fence struct {
	Room  RoomID
	Epoch uint64 // the page's allocation counter
}

func (f Fence) String() string { return fmt.Sprintf("%s/%d", f.Room, f.Epoch) }

// Header is the decoded form of a page header.
type Header struct {
	Fence    Fence
	Page     int32  // the page id this header was written for
	Ordinal  uint32 // position in the sequence's page table
	Tokens   uint32 // token slots in use
	Checksum uint32 // CRC-32 of header (checksum zeroed) and data
	Flags    uint16
}

// ErrBadHeader is wrapped by errors for headers that do not parse: wrong
// magic or version, unknown flags, non-zero reserved bytes. A page whose
// header does not parse fails every verification.
var ErrBadHeader = errors.New("kvpool: bad page header")

// Put encodes h into b[:HeaderSize].
func (h *Header) Put(b []byte) {
	_ = b[HeaderSize-1]
	binary.LittleEndian.PutUint32(b[offMagic:], headerMagic)
	binary.LittleEndian.PutUint16(b[offVersion:], headerVersion)
	binary.LittleEndian.PutUint16(b[offFlags:], h.Flags)
	copy(b[offRoom:offRoom+16], h.Fence.Room[:])
	binary.LittleEndian.PutUint64(b[offEpoch:], h.Fence.Epoch)
	binary.LittleEndian.PutUint32(b[offPage:], uint32(h.Page))
	binary.LittleEndian.PutUint32(b[offOrdinal:], h.Ordinal)
	binary.LittleEndian.PutUint32(b[offTokens:], h.Tokens)
	binary.LittleEndian.PutUint32(b[offChecksum:], h.Checksum)
	clear(b[offReserved:HeaderSize])
}

// ParseHeader decodes b[:HeaderSize]. It fails on anything it does not
// recognise, so a poisoned, stale-format or torn header fails closed.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: %d bytes", ErrBadHeader, len(b))
	}
	if m := binary.LittleEndian.Uint32(b[offMagic:]); m != headerMagic {
		return Header{}, fmt.Errorf("%w: magic %#x", ErrBadHeader, m)
	}
	if v := binary.LittleEndian.Uint16(b[offVersion:]); v != headerVersion {
		return Header{}, fmt.Errorf("%w: version %d", ErrBadHeader, v)
	}
	var h Header
	h.Flags = binary.LittleEndian.Uint16(b[offFlags:])
	if h.Flags&^knownFlags != 0 {
		return Header{}, fmt.Errorf("%w: flags %#x", ErrBadHeader, h.Flags)
	}
	for _, c := range b[offReserved:HeaderSize] {
		if c != 0 {
			return Header{}, fmt.Errorf("%w: reserved bytes set", ErrBadHeader)
		}
	}
	copy(h.Fence.Room[:], b[offRoom:offRoom+16])
	h.Fence.Epoch = binary.LittleEndian.Uint64(b[offEpoch:])
	h.Page = int32(binary.LittleEndian.Uint32(b[offPage:]))
	h.Ordinal = binary.LittleEndian.Uint32(b[offOrdinal:])
	h.Tokens = binary.LittleEndian.Uint32(b[offTokens:])
	h.Checksum = binary.LittleEndian.Uint32(b[offChecksum:])
	return h, nil
}

func binary32(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
func binary64(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }
