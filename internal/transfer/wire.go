package transfer

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/reqerr"
)

// Wire format, version 1. A frame is
//
//	u32  length of the rest of the frame
//	u8   version (WireVersion)
//	u8   type (MsgType)
//	[16] room
//	...  body, by type (below)
//	[16] MAC over version, type, room and body
//	...  Write only: the page data (DataLen bytes)
//
// Integers are little-endian. Bodies:
//
//	Open, Prefill  u32 peer, u32 prompt, u32 max
//	Grant          u64 key, u32 prompt, u32 count, u32 n, n x (i32 page, u64 epoch)
//	Reject         u8 kind, u32 prompt, u32 max, u32 limit
//	Write          u64 key, i32 page, [64] page header, u32 data length
//	Done           u32 pages, u32 tokens, i32 first token, u32 n, n x u32 checksum
//	Abort          u8 reason, u32 decode
//	Drained        (empty)
//	PeerEpoch      u32 peer, u64 epoch
//
// The decoder accepts exactly this and nothing else: unknown versions and
// types, short or long bodies, list lengths that disagree with the frame,
// unknown error kinds and frames over MaxFrame are errors.
const (
	WireVersion = 1
	// MaxFrame bounds a frame (a page of a large model is ~10 MB).
	MaxFrame = 1 << 28
	// MaxPages bounds the page lists of Grant and Done.
	MaxPages = 1 << 20

	lenPrefix = 4
	headSize  = 1 + 1 + 16
)

// Errors returned by Decode.
var (
	// ErrShortFrame: b does not yet hold a whole frame; read more.
	ErrShortFrame = errors.New("transfer: short frame")
	// ErrMalformed is wrapped by every other decoding error.
	ErrMalformed = errors.New("transfer: malformed frame")
)

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// appendSigned appends the bytes the MAC covers: version, type, room, body.
func appendSigned(b []byte, m Message) []byte {
	le := binary.LittleEndian
	b = append(b, WireVersion, byte(m.Type()))
	room := m.Env().Room
	b = append(b, room[:]...)
	switch m := m.(type) {
	case *Open:
		b = le.AppendUint32(b, uint32(m.Prefill))
		b = le.AppendUint32(b, m.PromptTokens)
		b = le.AppendUint32(b, m.MaxTokens)
	case *Prefill:
		b = le.AppendUint32(b, uint32(m.Decode))
		b = le.AppendUint32(b, m.PromptTokens)
		b = le.AppendUint32(b, m.MaxTokens)
	case *Grant:
		b = le.AppendUint64(b, uint64(m.Key))
		b = le.AppendUint32(b, m.PromptTokens)
		b = le.AppendUint32(b, m.PageCount)
		b = le.AppendUint32(b, uint32(len(m.Pages)))
		for i, pg := range m.Pages {
			b = le.AppendUint32(b, uint32(pg))
			var e uint64
			if i < len(m.Epochs) {
				e = m.Epochs[i]
			}
			b = le.AppendUint64(b, e)
		}
	case *Reject:
		b = append(b, byte(m.Kind))
		b = le.AppendUint32(b, m.Prompt)
		b = le.AppendUint32(b, m.MaxTokens)
		b = le.AppendUint32(b, m.Limit)
	case *Write:
		b = le.AppendUint64(b, uint64(m.Key))
		b = le.AppendUint32(b, uint32(m.Page))
		b = append(b, m.Header[:]...)
		b = le.AppendUint32(b, uint32(len(m.Data)))
	case *Done:
		b = le.AppendUint32(b, m.Pages)
		b = le.AppendUint32(b, m.Tokens)
		b = le.AppendUint32(b, uint32(m.FirstToken))
		b = le.AppendUint32(b, uint32(len(m.Checksums)))
		for _, c := range m.Checksums {
			b = le.AppendUint32(b, c)
		}
	case *Abort:
		b = append(b, byte(m.Reason))
		b = le.AppendUint32(b, uint32(m.Decode))
	case *Drained:
	case *PeerEpoch:
		b = le.AppendUint32(b, uint32(m.Peer))
		b = le.AppendUint64(b, m.Epoch)
	default:
		panic(fmt.Sprintf("kvfence: invariant violated: unknown message %T", m))
	}
	return b
}

// AppendEncode appends m's frame to dst. A Grant's Epochs must be as long
// as its Pages (a programmer error otherwise).
func AppendEncode(dst []byte, m Message) []byte {
	if g, ok := m.(*Grant); ok && len(g.Epochs) != len(g.Pages) {
		panic("kvfence: invariant violated: Grant with Pages and Epochs of different lengths")
	}
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = appendSigned(dst, m)
	mac := m.Env().MAC
	dst = append(dst, mac[:]...)
	if w, ok := m.(*Write); ok {
		dst = append(dst, w.Data...)
	}
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(dst)-start-lenPrefix))
	return dst
}

// AppendWriteHead appends w's frame without its data: a sender that
// writes the head and then w.Data (writev) sends exactly AppendEncode's
// bytes without copying the page.
func AppendWriteHead(dst []byte, w *Write) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = appendSigned(dst, w)
	dst = append(dst, w.MAC[:]...)
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(dst)-start-lenPrefix+len(w.Data)))
	return dst
}

// Encode returns m's frame.
func Encode(m Message) []byte { return AppendEncode(nil, m) }

// Decode decodes the first frame of b and returns the message and the
// number of bytes it used. It returns ErrShortFrame while b holds less
// than a whole frame, and an error wrapping ErrMalformed for anything that
// is not a well-formed version-1 frame. It does not check the MAC (the
// machines do, with Auth). A Write's Data aliases b; nothing else does.
func Decode(b []byte) (Message, int, error) {
	if len(b) < lenPrefix {
		return nil, 0, ErrShortFrame
	}
	n := binary.LittleEndian.Uint32(b)
	if n > MaxFrame {
		return nil, 0, malformed("frame of %d bytes exceeds %d", n, MaxFrame)
	}
	if n < headSize+MACSize {
		return nil, 0, malformed("frame of %d bytes is shorter than a header", n)
	}
	total := lenPrefix + int(n)
	if len(b) < total {
		return nil, 0, ErrShortFrame
	}
	f := b[lenPrefix:total]
	if f[0] != WireVersion {
		return nil, 0, malformed("version %d", f[0])
	}
	typ := MsgType(f[1])
	var room RoomID
	copy(room[:], f[2:headSize])
	r := reader{b: f[headSize:]}
	var m Message
	switch typ {
	case TypeOpen:
		o := &Open{Prefill: PeerID(r.u32()), PromptTokens: r.u32(), MaxTokens: r.u32()}
		m = o
	case TypePrefill:
		m = &Prefill{Decode: PeerID(r.u32()), PromptTokens: r.u32(), MaxTokens: r.u32()}
	case TypeGrant:
		g := &Grant{Key: WindowKey(r.u64()), PromptTokens: r.u32(), PageCount: r.u32()}
		cnt := r.u32()
		if cnt > MaxPages || int(cnt)*12 > len(r.b) {
			return nil, 0, malformed("grant lists %d pages", cnt)
		}
		g.Pages = make([]int32, cnt)
		g.Epochs = make([]uint64, cnt)
		for i := range g.Pages {
			g.Pages[i] = int32(r.u32())
			g.Epochs[i] = r.u64()
		}
		m = g
	case TypeReject:
		rj := &Reject{Kind: reqerr.Kind(r.u8()), Prompt: r.u32(), MaxTokens: r.u32(), Limit: r.u32()}
		if !r.bad && !rj.Kind.Valid() {
			return nil, 0, malformed("reject kind %d", rj.Kind)
		}
		m = rj
	case TypeWrite:
		w := &Write{Key: WindowKey(r.u64()), Page: int32(r.u32())}
		copy(w.Header[:], r.take(kvpool.HeaderSize))
		dl := r.u32()
		if r.bad {
			break
		}
		// The data follows the MAC and ends the frame.
		if len(r.b) < MACSize || uint64(len(r.b)-MACSize) != uint64(dl) {
			return nil, 0, malformed("write data length %d disagrees with the frame", dl)
		}
		copy(w.MAC[:], r.b[:MACSize])
		w.Data = r.b[MACSize:len(r.b):len(r.b)]
		w.Room = room
		return w, total, nil
	case TypeDone:
		d := &Done{Pages: r.u32(), Tokens: r.u32(), FirstToken: int32(r.u32())}
		cnt := r.u32()
		if cnt > MaxPages || int(cnt)*4 > len(r.b) {
			return nil, 0, malformed("done lists %d checksums", cnt)
		}
		if cnt > 0 {
			d.Checksums = make([]uint32, cnt)
		}
		for i := range d.Checksums {
			d.Checksums[i] = r.u32()
		}
		m = d
	case TypeAbort:
		a := &Abort{Reason: reqerr.Kind(r.u8()), Decode: PeerID(r.u32())}
		if !r.bad && !a.Reason.Valid() {
			return nil, 0, malformed("abort reason %d", a.Reason)
		}
		m = a
	case TypeDrained:
		m = &Drained{}
	case TypePeerEpoch:
		m = &PeerEpoch{Peer: PeerID(r.u32()), Epoch: r.u64()}
	default:
		return nil, 0, malformed("type %d", typ)
	}
	if r.bad {
		return nil, 0, malformed("%v body truncated", typ)
	}
	if len(r.b) != MACSize {
		return nil, 0, malformed("%v frame has %d bytes after the body, want a %d-byte MAC", typ, len(r.b), MACSize)
	}
	e := m.Env()
	e.Room = room
	copy(e.MAC[:], r.b)
	return m, total, nil
}

// reader consumes little-endian fields; a short read sets bad and returns
// zeros, checked once at the end.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) take(n int) []byte {
	if r.bad || len(r.b) < n {
		r.bad = true
		return make([]byte, n)
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() uint8   { return r.take(1)[0] }
func (r *reader) u32() uint32 { return binary.LittleEndian.Uint32(r.take(4)) }
func (r *reader) u64() uint64 { return binary.LittleEndian.Uint64(r.take(8)) }
