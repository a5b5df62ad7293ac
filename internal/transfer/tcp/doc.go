// Package tcp is the TCP transport of the transfer protocol: a link.Link
// over one TCP connection per (prefill, decode) pair, carrying the transfer
// package's versioned, length-prefixed frames in order.
//
// # Connection
//
// The prefill worker dials (Dial), the decode worker listens (Listen). A
// connection starts with a three-frame handshake of this package's own
// (link frames, below): hello from the dialer, hello from the listener with
// an HMAC-SHA256 proof under the cluster secret over both hellos, and the
// dialer's proof. Each hello carries the peer ids, a random nonce, the
// sender's incarnation (random per process) and the last epoch it knows.
// A peer that cannot prove the secret, names the wrong peer, or sends
// anything else is dropped before any transfer frame is read.
//
// Each established connection gets an epoch, strictly increasing per link;
// its PeerEpoch is delivered on both sides when the connection is
// established and again (a new epoch) when it is lost, only after the
// connection's reader and writer have stopped: nothing of the old
// connection can land or be reported afterwards (link package doc).
// The dialer reconnects with capped exponential backoff until Close.
//
// # Data path
//
// The receiver behaves like an RDMA NIC: a Write frame is verified (MAC) and
// copied straight into the decode pool by transfer.WindowTable.Land, with no
// decode logic, and acknowledged with a link ack frame that says whether it
// was applied or refused. The sender reports every posted write exactly once
// through Sink.Landed: on its ack, or as lost when the connection ends.
// Control frames go to the Sink in order. The sender writes page data from
// pool memory to the socket without copying it.
//
// # Framing
//
// Every frame starts with a little-endian u32 length of the rest. The next
// byte is the version: transfer.WireVersion for transfer frames (decoded by
// transfer.Decode), linkVersion for this package's frames:
//
//	hello  u8 kind=1, u32 from, u32 to, u64 incarnation, u64 last epoch, [16] nonce (+ [32] proof from the listener)
//	proof  u8 kind=2, [32] HMAC-SHA256
//	ack    u8 kind=3, u64 write sequence (per connection, from 1), u8 status
//
// A malformed frame, an unexpected frame or an ack out of sequence closes
// the connection with a logged reason; nothing panics on peer input.
//
// # Bounds
//
// Each connection's send queue is bounded in frames and bytes; a page write
// counts against it until it is acknowledged, so the bound also limits the
// data in flight. Send and Post block for room (backpressure), never the
// reader: Sinks do not block and acks are bounded by the peer's window.
package tcp
