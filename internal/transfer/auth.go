package transfer

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
)

// Auth signs and verifies messages under the cluster secret: HMAC-SHA256
// over the message's wire encoding (version, type, room, fields; for a
// Write, everything but the data), truncated to MACSize bytes. It is safe
// for concurrent use.
type Auth struct {
	key []byte
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
	h := hmac.New(sha256.New, a.key)
	h.Write(appendSigned(make([]byte, 0, 64), m))
	var out [MACSize]byte
	copy(out[:], h.Sum(nil))
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
