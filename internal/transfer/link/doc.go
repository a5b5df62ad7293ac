// Package link is the contract between a transfer transport and a worker:
// what a transport gives a prefill or decode worker for one peer (one
// prefill–decode pair), whatever carries the bytes (package inproc in one
// process, a TCP connection between processes, RDMA later).
//
// A link moves two things, in one FIFO per direction:
//
//   - control messages (transfer.Message, already signed by the machine
//     that produced them), delivered to the peer's Sink in the order they
//     were sent;
//   - page writes (transfer.PostWrite, prefill to decode only), applied on
//     the receiving side straight into the decode pool through
//     transfer.WindowTable.Land, like an RDMA NIC: the receiver checks the
//     MAC and the window key and nothing else; no decode logic runs. Every
//     posted write is reported back to the sender's Sink exactly once
//     (Sink.Landed): applied, refused by a revoked window, or lost with the
//     connection. The sender's driver turns the report into
//     transfer.PrefillMachine.Landed.
//
// # Connections and epochs
//
// A Link stands for a peer across connections. Each connection has an
// epoch, counted per link from 1 and strictly increasing. When a
// connection is established, and when it is lost, the transport delivers a
// signed *transfer.PeerEpoch{Peer: the remote worker, Epoch: the new epoch}
// to the Sinks of both sides, through Deliver, in line with the other
// messages. It delivers it only once nothing sent on the previous
// connection can still land or be reported: on the receiving side every
// write of the old connection has been applied or discarded, and on the
// sending side every write posted on it has been reported through Landed
// (so the transport holds no reference to any pool page of the sender).
// That ordering is what lets the machines release pages on a PeerEpoch
// (DESIGN.md §4, quarantine until a new connection epoch).
//
// # Backpressure
//
// Every queue is bounded. Send and Post block while the direction's queue
// is full, until there is room, ctx ends, or the connection is lost or the
// link closed. They never block on the peer's driver: Sink methods MUST NOT
// block (see Sink), so a queue always drains at the speed of the transport
// itself and two workers sending to each other cannot deadlock.
package link
