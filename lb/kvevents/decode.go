package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Wire layout decoded here (checked against vLLM's vllm/distributed/kv_events.py,
// SGLang's python/sglang/srt/disaggregation/kv_events.py, llm-d-kv-cache's
// kvevents/engineadapter and llm-d-inference-sim v0.10.2's kv_cache_sender.go):
//
//	ZMQ multipart: [topic, seq (8-byte big-endian), payload]
//	payload, positional (msgspec array_like=True; SGLang, older vLLM, the sim):
//	  batch = [ts float, events [...], data_parallel_rank int|nil (optional)]
//	  event = ["BlockStored", block_hashes, parent_block_hash|nil, token_ids,
//	           block_size, lora_id|nil, medium|nil, lora_name|nil, extra_keys,
//	           group_idx|nil, kv_cache_spec_kind|nil, ...]
//	        | ["BlockStored", ... medium|nil, {"cache_salt":..., "session_id":...}]
//	          (SGLang's BlockStoredWithMetadata, since SGLang 0.5.18: a map
//	          where vLLM has lora_name)
//	        | ["BlockRemoved", block_hashes, medium|nil, group_idx|nil, ...]
//	        | ["AllBlocksCleared", ...]
//	payload, named (newer vLLM without array_like, the sim's map format):
//	  batch = {"ts":..., "events":[...], "data_parallel_rank":...}
//	  event = {"type":"BlockStored", "block_hashes":..., "parent_block_hash":..., ...}
//
// Trailing fields may be omitted (msgspec omit_defaults; SGLang's shorter
// structs); unknown trailing fields and keys are skipped. A block hash is an
// int (Python hash, possibly negative) or bytes (vLLM's sha256 ExternalBlockHash).
// The sim sends parent_block_hash 0 for "no parent" in the positional form;
// the index treats a parent it does not know as unknown, and 0 as the root.
// SGLang with a bigram (EAGLE) radix key sends each token id as the pair
// (its token, the next one): token_ids [[t0,t1],[t1,t2],...], block_size
// the pairs' count (python/sglang/srt/mem_cache/events.py at cc6971b7);
// the pair's first is the position's token.
//
// SGLang's metadata (python/sglang/srt/disaggregation/kv_events.py,
// BlockStoredMetadata; wire pinned by SGLang's test_kv_events.py
// TestBlockStoredWireFormat) comes on every BlockStored of a node with a
// cache_salt, the first block's and its continuations' alike; its salt is
// keyed as vLLM's is (the first block's extra_keys, see Event.Extra): on a
// store from the root only, a continuation keeping its parent's keys. Its
// session_id (sglang#37482) is no part of a block's identity: skipped.
//
// lora_name (vLLM; lora_id alone in SGLang and older vLLM) and extra_keys
// (vLLM: one entry per block, nil or the keys vLLM hashed into that block
// besides its tokens: the LoRA name, then (mm identifier, offset) pairs,
// then the request's cache_salt on its first block, then a prompt-embeds
// hash) say that a block is not the base model's plain text block with
// those tokens: see Event.Extra and the index's store.
//
// group_idx (vLLM with a hybrid model: one KV-cache group per layer kind,
// each publishing its blocks under the same hashes) and, from vLLM 0.26,
// kv_cache_spec_kind ("full_attention", "sliding_window", "mamba", ...)
// say which group an event is of; see Index.keyedGroup. A sliding-window
// or mamba group's BlockStored may hold fewer hashes than its token ids
// span (vLLM's block_pool skips the group's null blocks): Event.Sparse.

// Kind is the type of one engine KV event.
type Kind uint8

const (
	BlockStored Kind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// BlockHash is an engine block hash as an opaque comparable value: "i" and 8
// big-endian bytes for an integer hash, "b" and the bytes for a bytes hash.
type BlockHash string

// NoHash is the absent parent (the first block of a sequence).
const NoHash BlockHash = ""

// IntHash is the BlockHash of an integer engine hash.
func IntHash(v uint64) BlockHash {
	var b [9]byte
	b[0] = 'i'
	binary.BigEndian.PutUint64(b[1:], v)
	return BlockHash(b[:])
}

// Event is one decoded engine event. A BlockStored may come without
// token ids (vLLM's CPU offloading connector): its message's other events
// apply, and the index skips it (counted as token_count).
type Event struct {
	Kind        Kind
	BlockHashes []BlockHash // BlockStored, BlockRemoved
	Parent      BlockHash   // BlockStored; NoHash when nil
	TokenIDs    []uint32    // BlockStored: len == len(BlockHashes)*BlockSize, or none (see below)
	BlockSize   int         // BlockStored; 0 with no TokenIDs
	LoraID      int64       // BlockStored; meaningful when HasLora
	HasLora     bool
	Medium      string // "GPU", "CPU", ... or empty
	LoraName    string // BlockStored: the LoRA adapter's name (vLLM's lora_name); empty when none
	// Group is the event's KV-cache group (vLLM's group_idx), meaningful
	// when HasGroup; SpecKind the group's kind (kv_cache_spec_kind), empty
	// when not given.
	Group    int
	HasGroup bool
	SpecKind string
	// Sparse: a BlockStored of fewer blocks than its token ids span (a
	// group's skipped null blocks); which blocks is not said, so its
	// TokenIDs are dropped and the index keys none.
	Sparse bool
	// Extra is a BlockStored's extra_keys, one per block; nil when it has
	// none at all (the base model's text blocks).
	Extra []ExtraKeys
}

// ExtraKeys is what the index needs of one block's extra_keys entry: its
// strings, in order, at most two (the LoRA name, then the cache_salt),
// and whether it holds anything else, which Sluice cannot reproduce from
// a request (a multimodal identifier, a prompt-embeds hash, a third
// string, a string over 256 bytes, an entry of another shape).
type ExtraKeys struct {
	Strings []string
	Other   bool
}

// maxExtraStrings: vLLM puts at most two strings in one block's keys.
const maxExtraStrings = 2

// Batch is one decoded payload.
type Batch struct {
	TS        float64
	Events    []Event
	DPRank    int // data-parallel rank; 0 when absent
	Unknown   int // events with a tag this decoder does not know (skipped)
	hasDPRank bool
}

// Message is one decoded ZMQ message.
type Message struct {
	Topic string
	Pod   string // <pod> of kv@<pod>@<model>
	Model string
	Seq   uint64
	Batch Batch
}

// Limits bound what one message may hold; anything over is dropped whole.
type Limits struct {
	MaxPayloadBytes   int // default 16 MiB
	MaxEventsPerBatch int // default 16384
	MaxBlocksPerEvent int // default 16384
	// MaxBlocksPerBatch bounds the block hashes of all events together
	// (default 262144): a hash costs one byte on the wire and some 32
	// decoded, so the payload bound alone let 16 MiB decode to 515 MiB.
	MaxBlocksPerBatch int
	MaxTokensPerEvent int // default 1<<20
	MaxBlockSize      int // tokens per engine block; default 4096
	MaxHashBytes      int // bytes hash length; default 64
}

// DefaultLimits fit a 1M-token prompt at block size 16 in one event.
func DefaultLimits() Limits {
	return Limits{
		MaxPayloadBytes:   16 << 20,
		MaxEventsPerBatch: 16384,
		MaxBlocksPerEvent: 16384,
		MaxBlocksPerBatch: 1 << 18, // a 1M-token step at block size 16 stored and removed, twice over
		MaxTokensPerEvent: 1 << 20,
		MaxBlockSize:      4096,
		MaxHashBytes:      64,
	}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxPayloadBytes <= 0 {
		l.MaxPayloadBytes = d.MaxPayloadBytes
	}
	if l.MaxEventsPerBatch <= 0 {
		l.MaxEventsPerBatch = d.MaxEventsPerBatch
	}
	if l.MaxBlocksPerEvent <= 0 {
		l.MaxBlocksPerEvent = d.MaxBlocksPerEvent
	}
	if l.MaxBlocksPerBatch <= 0 {
		l.MaxBlocksPerBatch = d.MaxBlocksPerBatch
	}
	if l.MaxTokensPerEvent <= 0 {
		l.MaxTokensPerEvent = d.MaxTokensPerEvent
	}
	if l.MaxBlockSize <= 0 {
		l.MaxBlockSize = d.MaxBlockSize
	}
	if l.MaxHashBytes <= 0 {
		l.MaxHashBytes = d.MaxHashBytes
	}
	return l
}

// Reason says why a message was dropped; it is a metric label.
type Reason string

const (
	ReasonFrames      Reason = "frames"       // not exactly 3 frames
	ReasonTopic       Reason = "topic"        // not kv@<host:port>@<model>
	ReasonSeq         Reason = "seq"          // sequence frame not 8 bytes
	ReasonPayloadSize Reason = "payload_size" // over MaxPayloadBytes
	ReasonMalformed   Reason = "malformed"    // not the msgpack layout above
	ReasonTooMany     Reason = "too_many"     // events, blocks or tokens over the limits
	ReasonBlockSize   Reason = "block_size"   // block size out of range
	ReasonTokenCount  Reason = "token_count"  // token ids != blocks * block size
	ReasonHash        Reason = "hash"         // a hash that is not an int or bytes within bounds
	ReasonUnknownPod  Reason = "unknown_pod"  // the topic's pod is no replica of the pool
	ReasonParent      Reason = "unknown_parent"
	// ReasonExtraKeys: a BlockStored whose blocks' hashes hold keys no
	// request's token ids give (a multimodal identifier, prompt embeds):
	// those blocks are held without keys, never matched (Index.store).
	ReasonExtraKeys Reason = "extra_keys"
	// ReasonGroup: an event of a KV-cache group the index does not key (a
	// hybrid model's sliding-window or mamba group, a group index out of
	// range): vLLM reuses a prefix as far as its full-attention group
	// holds it (Index.keyedGroup).
	ReasonGroup Reason = "kv_group"
	// ReasonSparse: a BlockStored of fewer blocks than its token ids span
	// (vLLM skips the null blocks of a sliding-window or mamba group): which
	// blocks it holds is not on the wire, so none is keyed.
	ReasonSparse Reason = "sparse_store"
	// ReasonLoraID: a BlockStored naming its LoRA adapter by lora_id alone;
	// requests name adapters by name and nothing maps one to the other, so
	// its blocks are held without keys (Index.store).
	ReasonLoraID    Reason = "lora_id_only"
	ReasonDuplicate Reason = "duplicate" // the sequence number of the message before, again
	// ReasonReplay: a replay answer that is not the asked topic's next
	// message (another topic or rank, a sequence before the one asked) or
	// not in the replay protocol's shape.
	ReasonReplay Reason = "replay_mismatch"
)

// DecodeError is a dropped message with its counted reason.
type DecodeError struct {
	Reason Reason
	Detail string
}

func (e *DecodeError) Error() string { return "kv events: " + string(e.Reason) + ": " + e.Detail }

func fail(r Reason, format string, args ...any) error {
	return &DecodeError{Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// ReasonOf is the counted reason of an error from this package.
func ReasonOf(err error) Reason {
	var de *DecodeError
	if errors.As(err, &de) {
		return de.Reason
	}
	return ReasonMalformed
}

const maxTopicBytes = 512

// DecodeMessage decodes the three frames of one ZMQ message.
func DecodeMessage(frames [][]byte, lim Limits) (Message, error) {
	lim = lim.withDefaults()
	if len(frames) != 3 {
		return Message{}, fail(ReasonFrames, "%d frames, want 3", len(frames))
	}
	pod, model, err := ParseTopic(string(frames[0]))
	if err != nil {
		return Message{}, err
	}
	if len(frames[1]) != 8 {
		return Message{}, fail(ReasonSeq, "sequence frame of %d bytes, want 8", len(frames[1]))
	}
	b, err := DecodeBatch(frames[2], lim)
	if err != nil {
		return Message{}, err
	}
	return Message{Topic: string(frames[0]), Pod: pod, Model: model,
		Seq: binary.BigEndian.Uint64(frames[1]), Batch: b}, nil
}

// ParseTopic splits kv@<pod>@<model>; the pod must be host:port. The model
// may itself contain '@'.
func ParseTopic(topic string) (pod, model string, err error) {
	if len(topic) > maxTopicBytes || !utf8.ValidString(topic) {
		return "", "", fail(ReasonTopic, "topic is not UTF-8 of at most %d bytes", maxTopicBytes)
	}
	parts := strings.SplitN(topic, "@", 3)
	if len(parts) != 3 || parts[0] != "kv" || parts[1] == "" {
		return "", "", fail(ReasonTopic, "topic %q is not kv@<host:port>@<model>", topic)
	}
	if err := checkHostPort(parts[1]); err != nil {
		return "", "", fail(ReasonTopic, "topic %q: %v", topic, err)
	}
	return parts[1], parts[2], nil
}

// DecodeBatch decodes one msgpack payload.
func DecodeBatch(payload []byte, lim Limits) (b Batch, err error) {
	lim = lim.withDefaults()
	if len(payload) > lim.MaxPayloadBytes {
		return Batch{}, fail(ReasonPayloadSize, "payload of %d bytes, limit %d", len(payload), lim.MaxPayloadBytes)
	}
	// The payload comes from the network: a decoding bug it trips must
	// cost that message (dropped as malformed), not the process (the
	// listener's goroutine has no other recover; an extra_keys slice
	// made with its length over its capacity once panicked here).
	defer func() {
		if p := recover(); p != nil {
			b, err = Batch{}, fail(ReasonMalformed, "decoder panic: %v", p)
		}
	}()
	r := &reader{d: msgpack.NewDecoder(bytes.NewReader(payload)), lim: lim}
	return r.batch()
}

type reader struct {
	d      *msgpack.Decoder
	lim    Limits
	blocks int // block hashes decoded so far in the batch (MaxBlocksPerBatch)
}

func malformed(err error) error {
	if err == nil {
		return nil
	}
	var de *DecodeError
	if errors.As(err, &de) {
		return err
	}
	return fail(ReasonMalformed, "%v", err)
}

func (r *reader) batch() (Batch, error) {
	var b Batch
	c, err := r.d.PeekCode()
	if err != nil {
		return b, malformed(err)
	}
	switch {
	case isArray(c):
		n, err := r.d.DecodeArrayLen()
		if err != nil {
			return b, malformed(err)
		}
		if n < 2 {
			return b, fail(ReasonMalformed, "batch array of %d fields, want at least 2", n)
		}
		if b.TS, err = r.float(); err != nil {
			return b, malformed(err)
		}
		if err := r.events(&b); err != nil {
			return b, malformed(err)
		}
		if n >= 3 {
			if b.DPRank, b.hasDPRank, err = r.optInt(); err != nil {
				return b, malformed(err)
			}
		}
		for i := 3; i < n; i++ {
			if err := r.skip(0); err != nil {
				return b, malformed(err)
			}
		}
	case isMap(c):
		n, err := r.d.DecodeMapLen()
		if err != nil {
			return b, malformed(err)
		}
		for i := 0; i < n; i++ {
			k, err := r.key()
			if err != nil {
				return b, malformed(err)
			}
			switch k {
			case "ts":
				b.TS, err = r.float()
			case "events":
				err = r.events(&b)
			case "data_parallel_rank":
				b.DPRank, b.hasDPRank, err = r.optInt()
			default:
				err = r.skip(0)
			}
			if err != nil {
				return b, malformed(err)
			}
		}
	default:
		return b, fail(ReasonMalformed, "batch is neither an array nor a map (code %#x)", c)
	}
	if b.DPRank < 0 || b.DPRank > math.MaxUint16 {
		return b, fail(ReasonMalformed, "data_parallel_rank %d out of range", b.DPRank)
	}
	return b, nil
}

func (r *reader) events(b *Batch) error {
	n, err := r.d.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n > r.lim.MaxEventsPerBatch {
		return fail(ReasonTooMany, "%d events in a batch, limit %d", n, r.lim.MaxEventsPerBatch)
	}
	if n > 0 {
		b.Events = make([]Event, 0, min(n, 64))
	}
	for i := 0; i < n; i++ {
		ev, known, err := r.event()
		if err != nil {
			return err
		}
		if !known {
			b.Unknown++
			continue
		}
		b.Events = append(b.Events, ev)
	}
	return nil
}

// event decodes one event; known is false for a tag it does not know
// (skipped, so a newer engine's extra event types do not stop the stream).
func (r *reader) event() (ev Event, known bool, err error) {
	c, err := r.d.PeekCode()
	if err != nil {
		return ev, false, err
	}
	f := fields{extraLen: -1}
	switch {
	case isArray(c):
		err = r.positional(&f)
	case isMap(c):
		err = r.named(&f)
	default:
		return ev, false, fail(ReasonMalformed, "event is neither an array nor a map (code %#x)", c)
	}
	if err != nil {
		return ev, false, err
	}
	switch f.tag {
	case "BlockStored":
		ev.Kind = BlockStored
	case "BlockRemoved":
		ev.Kind = BlockRemoved
	case "AllBlocksCleared":
		ev.Kind = AllBlocksCleared
		return ev, true, nil
	default:
		return ev, false, nil
	}
	if !f.has[fHashes] {
		return ev, false, fail(ReasonMalformed, "%s without block_hashes", f.tag)
	}
	ev.BlockHashes, ev.Medium = f.hashes, f.medium
	ev.Group, ev.HasGroup, ev.SpecKind = f.group, f.hasGroup, f.specKind
	if ev.Kind == BlockRemoved {
		return ev, true, nil
	}
	if !f.has[fTokens] || !f.has[fBlockSize] {
		return ev, false, fail(ReasonMalformed, "BlockStored without token_ids or block_size")
	}
	if len(f.tokens) == 0 && len(f.hashes) > 0 {
		// vLLM's CPU offloading connector stores blocks without token ids
		// (block_size 0 or its own), in the GPU's batches: an event the
		// index cannot key and skips, not a malformed message (dropped
		// whole, its sequence showed as a gap and cleared the rank).
		return ev, true, nil
	}
	if f.blockSize < 1 || f.blockSize > r.lim.MaxBlockSize {
		return ev, false, fail(ReasonBlockSize, "block_size %d outside 1..%d", f.blockSize, r.lim.MaxBlockSize)
	}
	if len(f.tokens) != len(f.hashes)*f.blockSize {
		if len(f.tokens)%f.blockSize == 0 && len(f.hashes) < len(f.tokens)/f.blockSize {
			// Whole blocks, some not cached (a sliding-window or mamba
			// group's null blocks): the engine's normal output, not a
			// malformed message.
			ev.Sparse = true
			return ev, true, nil
		}
		return ev, false, fail(ReasonTokenCount, "%d token ids for %d blocks of %d", len(f.tokens), len(f.hashes), f.blockSize)
	}
	ev.Parent, ev.TokenIDs, ev.BlockSize = f.parent, f.tokens, f.blockSize
	ev.LoraID, ev.HasLora, ev.LoraName = f.lora, f.hasLora, f.loraName
	switch {
	case f.extraBad || f.extraLen >= 0 && (f.extraLen != len(f.hashes) || f.salt != ""):
		// Not one entry per block, or SGLang's metadata and vLLM's
		// extra_keys together (no engine sends both): what each block's
		// keys are is unknown, so none is taken for a plain text block.
		ev.Extra = make([]ExtraKeys, len(f.hashes))
		for i := range ev.Extra {
			ev.Extra[i].Other = true
		}
	case f.salt != "" && f.parent == NoHash && len(f.hashes) > 0:
		// Keyed as vLLM's salt is: in the first block's extra keys, on the
		// store from the root; a continuation keeps its parent's keys.
		ev.Extra = make([]ExtraKeys, len(f.hashes))
		ev.Extra[0].Strings = []string{f.salt}
	case f.extra != nil:
		ev.Extra = f.extra
	}
	return ev, true, nil
}

// Field slots shared by the positional and named forms.
const (
	fHashes = iota
	fParent
	fTokens
	fBlockSize
	fLora
	fMedium
	fLoraName
	fExtra
	fGroup
	fSpecKind
	fMeta // SGLang's metadata in the named form (positionally it is in fLoraName's slot)
	nFields
)

type fields struct {
	tag       string
	hashes    []BlockHash
	parent    BlockHash
	tokens    []uint32
	blockSize int
	lora      int64
	hasLora   bool
	medium    string
	loraName  string
	extra     []ExtraKeys // nil while every entry so far was nil
	extraLen  int         // extra_keys' entries; -1: nil or absent
	extraBad  bool        // extra_keys neither nil nor a list
	group     int
	hasGroup  bool
	specKind  string
	salt      string // SGLang's metadata cache_salt; "" when none
	hasMeta   bool   // SGLang's metadata was given
	has       [nFields]bool
}

// Positional slots after the tag, per event kind.
var (
	storedOrder  = []int{fHashes, fParent, fTokens, fBlockSize, fLora, fMedium, fLoraName, fExtra, fGroup, fSpecKind}
	removedOrder = []int{fHashes, fMedium, fGroup, fSpecKind}
)

func (r *reader) positional(f *fields) error {
	n, err := r.d.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n < 1 {
		return fail(ReasonMalformed, "event array without a tag")
	}
	if f.tag, err = r.shortString(); err != nil {
		return err
	}
	var order []int
	switch f.tag {
	case "BlockStored":
		order = storedOrder
	case "BlockRemoved":
		order = removedOrder
	}
	for i := 1; i < n; i++ {
		if i-1 < len(order) {
			err = r.field(f, order[i-1])
		} else {
			err = r.skip(0)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

var namedSlots = map[string]int{
	"block_hashes":       fHashes,
	"parent_block_hash":  fParent,
	"token_ids":          fTokens,
	"block_size":         fBlockSize,
	"lora_id":            fLora,
	"medium":             fMedium,
	"lora_name":          fLoraName,
	"extra_keys":         fExtra,
	"group_idx":          fGroup,
	"kv_cache_spec_kind": fSpecKind,
	"metadata":           fMeta,
}

func (r *reader) named(f *fields) error {
	n, err := r.d.DecodeMapLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		k, err := r.key()
		if err != nil {
			return err
		}
		if k == "type" {
			if f.tag, err = r.shortString(); err != nil {
				return err
			}
			continue
		}
		slot, ok := namedSlots[k]
		if !ok {
			err = r.skip(0)
		} else {
			err = r.field(f, slot)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (r *reader) field(f *fields, slot int) error {
	if f.has[slot] {
		return fail(ReasonMalformed, "field %d given twice", slot)
	}
	f.has[slot] = true
	var err error
	switch slot {
	case fHashes:
		f.hashes, err = r.hashes()
	case fParent:
		f.parent, err = r.optHash()
	case fTokens:
		f.tokens, err = r.tokens()
	case fBlockSize:
		// Checked in event, once it is known whether the event has tokens
		// (an offloaded block's may be 0).
		var v int64
		v, err = r.int()
		f.blockSize = int(max(min(v, math.MaxInt32), math.MinInt32))
	case fLora:
		var v int
		v, f.hasLora, err = r.optInt()
		f.lora = int64(v)
	case fMedium:
		f.medium, err = r.optShortString()
	case fLoraName:
		err = r.loraName(f)
	case fExtra:
		err = r.extraKeys(f)
	case fGroup:
		// Any int32 decodes; the index keys only 0..maxGroupIdx.
		f.group, f.hasGroup, err = r.optInt()
	case fSpecKind:
		f.specKind, err = r.optShortString()
	case fMeta:
		err = r.metadata(f)
	}
	return err
}

// maxLoraName bounds an adapter's name: one longer is not an error (the
// message's other events apply) but its blocks are not keyed.
const maxLoraName = 1024

func (r *reader) loraName(f *fields) error {
	c, err := r.d.PeekCode()
	if err != nil {
		return err
	}
	if c == msgpcode.Nil {
		return r.d.DecodeNil()
	}
	if isMap(c) {
		// SGLang's BlockStoredWithMetadata: its metadata in this slot.
		return r.metadata(f)
	}
	if !msgpcode.IsString(c) {
		return fail(ReasonMalformed, "lora_name is not a string (code %#x)", c)
	}
	s, err := r.d.DecodeString()
	if err != nil {
		return err
	}
	if len(s) > maxLoraName {
		f.extraBad = true
		return nil
	}
	f.loraName = s
	return nil
}

// metadata reads SGLang's BlockStoredMetadata, a map: its cache_salt, a
// string, is kept; a salt Sluice cannot key a request by (not a string,
// empty, over 256 bytes, given twice) leaves the event's blocks unkeyed;
// other keys (session_id) are skipped.
func (r *reader) metadata(f *fields) error {
	if f.hasMeta {
		return fail(ReasonMalformed, "metadata given twice")
	}
	f.hasMeta = true
	c, err := r.d.PeekCode()
	if err != nil {
		return err
	}
	if c == msgpcode.Nil {
		return r.d.DecodeNil()
	}
	if !isMap(c) {
		return fail(ReasonMalformed, "metadata is not a map (code %#x)", c)
	}
	n, err := r.d.DecodeMapLen()
	if err != nil {
		return err
	}
	seen := false
	for i := 0; i < n; i++ {
		k, err := r.key()
		if err != nil {
			return err
		}
		if k != "cache_salt" {
			if err := r.skip(1); err != nil {
				return err
			}
			continue
		}
		c, err := r.d.PeekCode()
		if err != nil {
			return err
		}
		switch {
		case c == msgpcode.Nil:
			err = r.d.DecodeNil()
		case msgpcode.IsString(c):
			var s string
			if s, err = r.d.DecodeString(); err == nil {
				if seen || s == "" || len(s) > maxShortString {
					f.extraBad = true
				}
				f.salt = s
			}
		default:
			f.extraBad = true
			err = r.skip(1)
		}
		if err != nil {
			return err
		}
		seen = true
	}
	return nil
}

// extraKeys reads extra_keys: nil, or one entry per block. Its entries
// count in MaxBlocksPerBatch with the hashes (each costs a byte on the
// wire and more decoded); an entry stays unallocated until one is not nil.
func (r *reader) extraKeys(f *fields) error {
	c, err := r.d.PeekCode()
	if err != nil {
		return err
	}
	if c == msgpcode.Nil {
		return r.d.DecodeNil()
	}
	if !isArray(c) {
		f.extraBad = true
		return r.skip(0)
	}
	n, err := r.d.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n > r.lim.MaxBlocksPerEvent {
		return fail(ReasonTooMany, "%d extra_keys in an event, limit %d", n, r.lim.MaxBlocksPerEvent)
	}
	if r.blocks += n; r.blocks > r.lim.MaxBlocksPerBatch {
		return fail(ReasonTooMany, "over %d blocks in a batch", r.lim.MaxBlocksPerBatch)
	}
	f.extraLen = n
	for i := 0; i < n; i++ {
		e, err := r.extraEntry()
		if err != nil {
			return err
		}
		if f.extra == nil && (e.Other || len(e.Strings) > 0) {
			// The entries before it were nil; room for a few more (the
			// capacity at least the length: a first entry after the
			// 1024th made it a panic).
			f.extra = make([]ExtraKeys, i, max(i+1, min(n, 1024)))
		}
		if f.extra != nil {
			f.extra = append(f.extra, e)
		}
	}
	return nil
}

// extraEntry reads one block's extra keys (see ExtraKeys).
func (r *reader) extraEntry() (ExtraKeys, error) {
	var e ExtraKeys
	c, err := r.d.PeekCode()
	if err != nil {
		return e, err
	}
	if c == msgpcode.Nil {
		return e, r.d.DecodeNil()
	}
	if !isArray(c) {
		e.Other = true
		return e, r.skip(1)
	}
	n, err := r.d.DecodeArrayLen()
	if err != nil {
		return e, err
	}
	for i := 0; i < n; i++ {
		c, err := r.d.PeekCode()
		if err != nil {
			return e, err
		}
		if !msgpcode.IsString(c) || len(e.Strings) == maxExtraStrings {
			e.Other = true
			if err := r.skip(2); err != nil {
				return e, err
			}
			continue
		}
		s, err := r.d.DecodeString()
		if err != nil {
			return e, err
		}
		if len(s) > maxShortString {
			e.Other = true
			continue
		}
		e.Strings = append(e.Strings, s)
	}
	return e, nil
}

func (r *reader) hashes() ([]BlockHash, error) {
	n, err := r.d.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, fail(ReasonMalformed, "block_hashes is nil")
	}
	if n > r.lim.MaxBlocksPerEvent {
		return nil, fail(ReasonTooMany, "%d blocks in an event, limit %d", n, r.lim.MaxBlocksPerEvent)
	}
	if r.blocks += n; r.blocks > r.lim.MaxBlocksPerBatch {
		return nil, fail(ReasonTooMany, "over %d blocks in a batch", r.lim.MaxBlocksPerBatch)
	}
	out := make([]BlockHash, 0, min(n, 1024))
	for i := 0; i < n; i++ {
		h, err := r.hash()
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, nil
}

func (r *reader) optHash() (BlockHash, error) {
	c, err := r.d.PeekCode()
	if err != nil {
		return NoHash, err
	}
	if c == msgpcode.Nil {
		return NoHash, r.d.DecodeNil()
	}
	return r.hash()
}

func (r *reader) hash() (BlockHash, error) {
	c, err := r.d.PeekCode()
	if err != nil {
		return NoHash, err
	}
	switch {
	case isInt(c):
		if c == msgpcode.Uint64 {
			v, err := r.d.DecodeUint64()
			return IntHash(v), err
		}
		v, err := r.d.DecodeInt64()
		return IntHash(uint64(v)), err
	case msgpcode.IsBin(c) || msgpcode.IsString(c):
		b, err := r.d.DecodeBytes()
		if err != nil {
			return NoHash, err
		}
		if len(b) == 0 || len(b) > r.lim.MaxHashBytes {
			return NoHash, fail(ReasonHash, "bytes hash of %d bytes, want 1..%d", len(b), r.lim.MaxHashBytes)
		}
		return BlockHash("b" + string(b)), nil
	}
	return NoHash, fail(ReasonHash, "hash is neither an int nor bytes (code %#x)", c)
}

func (r *reader) tokens() ([]uint32, error) {
	n, err := r.d.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, fail(ReasonMalformed, "token_ids is nil")
	}
	if n > r.lim.MaxTokensPerEvent {
		return nil, fail(ReasonTooMany, "%d token ids in an event, limit %d", n, r.lim.MaxTokensPerEvent)
	}
	out := make([]uint32, 0, min(n, 4096))
	bigram := false
	for i := 0; i < n; i++ {
		if i == 0 {
			c, err := r.d.PeekCode()
			if err != nil {
				return nil, err
			}
			bigram = isArray(c)
		}
		v, err := r.token(bigram)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// token reads one token id, or with bigram one SGLang bigram pair
// [token, next token], of which it returns the first.
func (r *reader) token(bigram bool) (uint32, error) {
	if bigram {
		c, err := r.d.PeekCode()
		if err != nil {
			return 0, err
		}
		if !isArray(c) {
			return 0, fail(ReasonMalformed, "a token id among bigram pairs (code %#x)", c)
		}
		n, err := r.d.DecodeArrayLen()
		if err != nil {
			return 0, err
		}
		if n != 2 {
			return 0, fail(ReasonMalformed, "bigram token of %d ids, want 2", n)
		}
		first, err := r.token(false)
		if err != nil {
			return 0, err
		}
		_, err = r.token(false)
		return first, err
	}
	v, err := r.int()
	if err != nil {
		return 0, err
	}
	if v < 0 || v > math.MaxUint32 {
		return 0, fail(ReasonMalformed, "token id %d out of range", v)
	}
	return uint32(v), nil
}

func (r *reader) int() (int64, error) {
	c, err := r.d.PeekCode()
	if err != nil {
		return 0, err
	}
	if !isInt(c) {
		return 0, fail(ReasonMalformed, "want an int (code %#x)", c)
	}
	if c == msgpcode.Uint64 {
		v, err := r.d.DecodeUint64()
		if err == nil && v > math.MaxInt64 {
			return 0, fail(ReasonMalformed, "int %d out of range", v)
		}
		return int64(v), err
	}
	return r.d.DecodeInt64()
}

func (r *reader) optInt() (int, bool, error) {
	c, err := r.d.PeekCode()
	if err != nil {
		return 0, false, err
	}
	if c == msgpcode.Nil {
		return 0, false, r.d.DecodeNil()
	}
	v, err := r.int()
	if err != nil {
		return 0, false, err
	}
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, false, fail(ReasonMalformed, "int %d out of range", v)
	}
	return int(v), true, nil
}

func (r *reader) float() (float64, error) {
	c, err := r.d.PeekCode()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Float || c == msgpcode.Double {
		return r.d.DecodeFloat64()
	}
	v, err := r.int()
	return float64(v), err
}

const maxShortString = 256

// shortString reads a tag, key or medium: a string of at most 256 bytes.
func (r *reader) shortString() (string, error) {
	c, err := r.d.PeekCode()
	if err != nil {
		return "", err
	}
	if !msgpcode.IsString(c) && !msgpcode.IsBin(c) {
		return "", fail(ReasonMalformed, "want a string (code %#x)", c)
	}
	s, err := r.d.DecodeString()
	if err != nil {
		return "", err
	}
	if len(s) > maxShortString {
		return "", fail(ReasonMalformed, "string of %d bytes, limit %d", len(s), maxShortString)
	}
	return s, nil
}

func (r *reader) optShortString() (string, error) {
	c, err := r.d.PeekCode()
	if err != nil {
		return "", err
	}
	if c == msgpcode.Nil {
		return "", r.d.DecodeNil()
	}
	return r.shortString()
}

func (r *reader) key() (string, error) { return r.shortString() }

// maxSkipDepth bounds nesting in skipped values: the library's own Skip
// recurses without a bound, and a deep enough nest would exhaust the stack.
const maxSkipDepth = 32

func (r *reader) skip(depth int) error {
	if depth > maxSkipDepth {
		return fail(ReasonMalformed, "nesting deeper than %d", maxSkipDepth)
	}
	c, err := r.d.PeekCode()
	if err != nil {
		return err
	}
	switch {
	case isArray(c):
		n, err := r.d.DecodeArrayLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case isMap(c):
		n, err := r.d.DecodeMapLen()
		if err != nil {
			return err
		}
		for i := 0; i < 2*n; i++ {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	}
	return r.d.Skip()
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isInt(c byte) bool {
	if msgpcode.IsFixedNum(c) {
		return true
	}
	switch c {
	case msgpcode.Uint8, msgpcode.Uint16, msgpcode.Uint32, msgpcode.Uint64,
		msgpcode.Int8, msgpcode.Int16, msgpcode.Int32, msgpcode.Int64:
		return true
	}
	return false
}
