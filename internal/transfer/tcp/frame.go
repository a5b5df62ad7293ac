package tcp

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kvfence/kvfence/internal/transfer"
)

// Link frames share the transfer frames' length prefix; their version byte
// tells them apart (transfer frames carry transfer.WireVersion).
const (
	linkVersion = 0x81

	kindHello = 1
	kindProof = 2
	kindAck   = 3

	nonceSize  = 16
	proofSize  = sha256.Size
	helloBody  = 4 + 4 + 8 + 8 + nonceSize
	helloFrame = 4 + 2 + helloBody // the dialer's hello; the listener's adds a proof
	proofFrame = 4 + 2 + proofSize
	ackFrame   = 4 + 2 + 8 + 1

	// maxHandshakeFrame bounds what an unauthenticated peer can make the
	// listener read.
	maxHandshakeFrame = helloFrame + proofSize
)

// Ack statuses.
const (
	ackApplied     = 0
	ackNoWindow    = 1
	ackNotInWindow = 2
	ackWriteSize   = 3
	ackBadMAC      = 4
	ackLimit       = 5
)

// errBadMAC is the refusal of a write whose MAC does not verify.
var errBadMAC = errors.New("tcp: write MAC does not verify")

// errMalformed is wrapped by every error about peer bytes.
var errMalformed = errors.New("tcp: malformed link frame")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errMalformed, fmt.Sprintf(format, args...))
}

// ackStatus maps the outcome of Land (or the MAC check) to a status.
func ackStatus(err error) byte {
	switch {
	case err == nil:
		return ackApplied
	case errors.Is(err, transfer.ErrNoWindow):
		return ackNoWindow
	case errors.Is(err, transfer.ErrPageNotInWindow):
		return ackNotInWindow
	case errors.Is(err, transfer.ErrWriteSize):
		return ackWriteSize
	default:
		return ackBadMAC
	}
}

// statusErr is the reason of a refused write, for the sender's report.
var statusErr = [ackLimit]error{
	nil, transfer.ErrNoWindow, transfer.ErrPageNotInWindow, transfer.ErrWriteSize, errBadMAC,
}

type hello struct {
	from, to    transfer.PeerID
	incarnation uint64
	lastEpoch   uint64
	nonce       [nonceSize]byte
}

func appendHello(b []byte, h hello, proof []byte) []byte {
	le := binary.LittleEndian
	start := len(b)
	b = append(b, 0, 0, 0, 0, linkVersion, kindHello)
	b = le.AppendUint32(b, uint32(h.from))
	b = le.AppendUint32(b, uint32(h.to))
	b = le.AppendUint64(b, h.incarnation)
	b = le.AppendUint64(b, h.lastEpoch)
	b = append(b, h.nonce[:]...)
	b = append(b, proof...)
	le.PutUint32(b[start:], uint32(len(b)-start-4))
	return b
}

// parseHello decodes a hello frame (f without its length prefix); withProof
// says whether it must end with a proof, which is returned.
func parseHello(f []byte, withProof bool) (hello, []byte, error) {
	want := 2 + helloBody
	if withProof {
		want += proofSize
	}
	if len(f) != want || f[0] != linkVersion || f[1] != kindHello {
		return hello{}, nil, malformed("not a hello frame (%d bytes)", len(f))
	}
	le := binary.LittleEndian
	b := f[2:]
	h := hello{
		from:        transfer.PeerID(le.Uint32(b)),
		to:          transfer.PeerID(le.Uint32(b[4:])),
		incarnation: le.Uint64(b[8:]),
		lastEpoch:   le.Uint64(b[16:]),
	}
	copy(h.nonce[:], b[24:])
	var proof []byte
	if withProof {
		proof = b[helloBody:]
	}
	return h, proof, nil
}

func appendProof(b []byte, proof []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(2+len(proof)))
	b = append(b, linkVersion, kindProof)
	return append(b, proof...)
}

func parseProof(f []byte) ([]byte, error) {
	if len(f) != 2+proofSize || f[0] != linkVersion || f[1] != kindProof {
		return nil, malformed("not a proof frame (%d bytes)", len(f))
	}
	return f[2:], nil
}

// handshakeMAC is the proof of one side: HMAC-SHA256 under the cluster
// secret over a role label and both hellos (without proofs), so a proof
// binds the ids, incarnations, epochs and both nonces and cannot be
// replayed on another connection or reflected to the other role.
func handshakeMAC(secret []byte, role string, dialer, listener hello) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("kvfence/tcp/1 " + role))
	m.Write(appendHello(nil, dialer, nil))
	m.Write(appendHello(nil, listener, nil))
	return m.Sum(nil)
}

func appendAck(b []byte, seq uint64, status byte) []byte {
	le := binary.LittleEndian
	b = le.AppendUint32(b, 2+8+1)
	b = append(b, linkVersion, kindAck)
	b = le.AppendUint64(b, seq)
	return append(b, status)
}

// parseAck decodes an ack frame (f without its length prefix).
func parseAck(f []byte) (seq uint64, status byte, err error) {
	if len(f) < 2 || f[0] != linkVersion || f[1] != kindAck {
		return 0, 0, malformed("unexpected link frame (%d bytes)", len(f))
	}
	if len(f) != 2+8+1 {
		return 0, 0, malformed("ack frame of %d bytes", len(f))
	}
	seq = binary.LittleEndian.Uint64(f[2:])
	status = f[10]
	if status >= ackLimit {
		return 0, 0, malformed("ack status %d", status)
	}
	return seq, status, nil
}

// Offsets in a transfer Write frame (transfer/wire.go, version 1): the
// length prefix, then version, type, room, key, page, header, data length.
const (
	writeDataLenOff = 4 + 1 + 1 + 16 + 8 + 4 + 64
	writeHeadLen    = writeDataLenOff + 4 + transfer.MACSize
)

// appendWriteHead appends the frame of w without its data: exactly the
// bytes transfer.Encode(w) puts before w.Data, so that the data can go to
// the socket straight from pool memory.
func appendWriteHead(dst []byte, w *transfer.Write) []byte {
	start := len(dst)
	head := transfer.Write{Envelope: w.Envelope, Key: w.Key, Page: w.Page, Header: w.Header}
	dst = transfer.AppendEncode(dst, &head)
	le := binary.LittleEndian
	le.PutUint32(dst[start:], le.Uint32(dst[start:])+uint32(len(w.Data)))
	le.PutUint32(dst[start+writeDataLenOff:], uint32(len(w.Data)))
	return dst
}
