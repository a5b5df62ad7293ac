package transfer

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"hash"
	"sync"
)

// Auth signs and verifies messages under the cluster secret: HMAC-SHA256
// over the message's wire encoding (version, type, room, fields; for a
// Write, everything but the data), truncated to MACSize bytes. It is safe
// for concurrent use.
type Auth struct {
	key []byte
	// macs holds keyed HMAC states for reuse: every message is signed or
	// verified at least once, and a fresh hmac.New per message was most of
	// the protocol's allocations.
	macs sync.Pool // of *macState
}

// macState is one reusable HMAC computation.
type macState struct {
	h   hash.Hash
	buf []byte // the signed encoding
	sum []byte // the full HMAC output
}

// MinSecret is the shortest cluster secret accepted.
const MinSecret = 16

// NewAuth returns an Auth for secret, which must hold at least MinSecret
// bytes of entropy (the caller reads it from a file or the environment).
func NewAuth(secret []byte) (*Auth, error) {
	if len(secret) < MinSecret {
		return nil, errors.New("transfer: cluster secret shorter than 16 bytes")
	}
	return &Auth{key: append([]byte(nil), secret...)}, nil
}

func (a *Auth) mac(m Message) [MACSize]byte {
	st, _ := a.macs.Get().(*macState)
	if st == nil {
		st = &macState{h: hmac.New(sha256.New, a.key), buf: make([]byte, 0, 256), sum: make([]byte, 0, sha256.Size)}
	}
	st.h.Reset()
	st.buf = appendSigned(st.buf[:0], m)
	st.h.Write(st.buf)
	st.sum = st.h.Sum(st.sum[:0])
	var out [MACSize]byte
	copy(out[:], st.sum)
	if cap(st.buf) <= 64<<10 { // a Grant of many pages makes a big one; let it go
		a.macs.Put(st)
	}
	return out
}

// Sign sets m's MAC. Sign before sending; never modify m afterwards.
func (a *Auth) Sign(m Message) { m.Env().MAC = a.mac(m) }

// Verify reports whether m's MAC is the one the cluster secret gives
// (constant time).
func (a *Auth) Verify(m Message) bool {
	want := a.mac(m)
	return hmac.Equal(want[:], m.Env().MAC[:])
}
