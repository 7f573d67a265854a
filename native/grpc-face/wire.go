package main

// EvaluateRequest and BatchEvaluate's messages taken apart and built by field number (proto/grpcgrade/v1/
// grading.proto), with protobuf's own wire reader (protowire): the face never needs the messages' types,
// only which field is the sample and which fields make the plan.

import (
	"errors"

	"google.golang.org/protobuf/encoding/protowire"
)

// EvaluateRequest's fields.
const (
	evalGraders = 1 // repeated GraderSpec
	evalSample  = 2 // Sample
	evalReward  = 3 // string
	evalTimeout = 4 // double
	evalView    = 5 // ResultView
	evalCache   = 6 // CacheMode
)

// BatchEvaluateRequest's fields the face writes.
const (
	batchGraders = 1
	batchSamples = 2
	batchReward  = 3
	batchTimeout = 4
	batchView    = 6
	batchCache   = 9
)

// ResultView's values: Evaluate answers RESULT_VIEW_COLUMNS as the scores view (one sample has no columns).
const (
	viewScores  = 2
	viewColumns = 3
)

// A split EvaluateRequest: the plan as BatchEvaluateRequest fields (the bytes that key a group of calls),
// and the sample's bytes.
type split struct {
	plan   []byte
	sample []byte
}

var errUnsplittable = errors.New("not a request the face splits")

// splitEvaluate takes an EvaluateRequest apart. errUnsplittable for anything it does not know exactly (a
// field this face does not know, a wire type that is not the field's, a sample given twice, a view this
// server does not define): such a call is relayed as it is, and the engine says what is wrong with it.
func splitEvaluate(request []byte) (split, error) {
	var out split
	seenSample := false
	b := request
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return split{}, errUnsplittable
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return split{}, errUnsplittable
		}
		value := b[n : n+m]
		b = b[n+m:]
		switch {
		case num == evalGraders && typ == protowire.BytesType:
			out.plan = protowire.AppendTag(out.plan, batchGraders, protowire.BytesType)
			out.plan = append(out.plan, value...)
		case num == evalSample && typ == protowire.BytesType && !seenSample:
			v, k := protowire.ConsumeBytes(value)
			if k < 0 {
				return split{}, errUnsplittable
			}
			out.sample, seenSample = v, true
		case num == evalReward && typ == protowire.BytesType:
			out.plan = protowire.AppendTag(out.plan, batchReward, protowire.BytesType)
			out.plan = append(out.plan, value...)
		case num == evalTimeout && typ == protowire.Fixed64Type:
			out.plan = protowire.AppendTag(out.plan, batchTimeout, protowire.Fixed64Type)
			out.plan = append(out.plan, value...)
		case num == evalView && typ == protowire.VarintType:
			view, _ := protowire.ConsumeVarint(value)
			if view > viewColumns {
				return split{}, errUnsplittable
			}
			if view == viewColumns {
				view = viewScores
			}
			out.plan = protowire.AppendTag(out.plan, batchView, protowire.VarintType)
			out.plan = protowire.AppendVarint(out.plan, view)
		case num == evalCache && typ == protowire.VarintType:
			out.plan = protowire.AppendTag(out.plan, batchCache, protowire.VarintType)
			out.plan = append(out.plan, value...)
		default:
			return split{}, errUnsplittable
		}
	}
	return out, nil
}

// unaryBatch is BatchEvaluateUnaryRequest's field and BatchEvaluateUnaryResponse's: the batch request, and
// the answer (a BatchEvaluateResponse), each wrapped in a message of its own.
const unaryBatch = 1

// batchRequest is a BatchEvaluateUnaryRequest of `plan` and `samples` (in their order), and the
// BatchEvaluateRequest it wraps: the same bytes past the wrapper's tag and length, so the request is
// written once for either method (BatchEvaluate takes `batch` when the unary answer would be over one message).
func batchRequest(plan []byte, samples [][]byte) (wrapped, batch []byte) {
	size := len(plan)
	for _, s := range samples {
		size += 1 + protowire.SizeBytes(len(s))
	}
	out := make([]byte, 0, 1+protowire.SizeVarint(uint64(size))+size)
	out = protowire.AppendTag(out, unaryBatch, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(size))
	head := len(out)
	out = append(out, plan...)
	for _, s := range samples {
		out = protowire.AppendTag(out, batchSamples, protowire.BytesType)
		out = protowire.AppendBytes(out, s)
	}
	return out, out[head:]
}

// unaryAnswer is the BatchEvaluateResponse a BatchEvaluateUnaryResponse holds (its `answer`, merged as
// protobuf merges a message field given twice); an error for a message that is not one.
func unaryAnswer(message []byte) ([]byte, error) {
	var out []byte
	err := fields(message, func(num protowire.Number, typ protowire.Type, value []byte) error {
		if num == unaryBatch && typ == protowire.BytesType {
			out = append(out, value...)
		}
		return nil
	})
	return out, err
}

// fields gives `each` every field of `message` in order: its number, wire type and value (a length-
// delimited field's content, any other's encoded value); the first error `each` returns ends it, and a
// message that is not one is an error.
func fields(message []byte, each func(num protowire.Number, typ protowire.Type, value []byte) error) error {
	b := message
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return protowire.ParseError(m)
		}
		value := b[:m]
		if typ == protowire.BytesType {
			value, _ = protowire.ConsumeBytes(value) // whole: ConsumeFieldValue has read it
		}
		b = b[m:]
		if err := each(num, typ, value); err != nil {
			return err
		}
	}
	return nil
}

// An item of a BatchEvaluateResponse: the sample's position in the request, and its EvaluateResponse.
type item struct {
	index  uint64
	result []byte
}

// batchItems reads a BatchEvaluateResponse's items (field 1: BatchItem{index = 1, result = 2}); an error for
// a message that is not one, or that carries columns (field 2), which the face never asks for.
func batchItems(message []byte) ([]item, error) {
	var items []item
	err := fields(message, func(num protowire.Number, typ protowire.Type, value []byte) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			one, err := batchItem(value)
			if err != nil {
				return err
			}
			items = append(items, one)
		case num == 2:
			return errors.New("the engine answered with columns")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return items, nil
}

func batchItem(raw []byte) (item, error) {
	out := item{result: []byte{}}
	err := fields(raw, func(num protowire.Number, typ protowire.Type, value []byte) error {
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(value)
			if m < 0 {
				return protowire.ParseError(m)
			}
			out.index = v
		case num == 2 && typ == protowire.BytesType:
			out.result = append(out.result, value...) // a message given twice merges: concatenated
		}
		return nil
	})
	if err != nil {
		return item{}, err
	}
	return out, nil
}

// leftOutNote is how the engine's first result's reason begins when it left out an answer's reasons and
// metadata to fit it in a message (service/convert.py's leave_out_details, LEFT_OUT_NOTE), followed by the
// answer's size. The same words as there: tests/test_native_face.py fails when they part.
const leftOutNote = "reason and metadata left out: this sample's answer is "

// leftOutSize is the size, in bytes, the engine gave an EvaluateResponse whose details it left out (its
// first result's reason says so), or -1 for an answer it sent whole (or that is not one it wrote).
func leftOutSize(response []byte) int64 {
	results, ok := firstField(response, 2) // EvaluateResponse.results
	if !ok {
		return -1
	}
	reason, ok := firstField(results, 4) // GraderResult.reason
	if !ok || len(reason) <= len(leftOutNote) || string(reason[:len(leftOutNote)]) != leftOutNote {
		return -1
	}
	size := int64(0)
	digits := reason[len(leftOutNote):]
	for i, b := range digits {
		if b < '0' || b > '9' || size > 1<<40 {
			if i == 0 {
				return -1
			}
			return size
		}
		size = size*10 + int64(b-'0')
	}
	return -1 // the note always goes on past the size
}

// firstField is the value of the first length-delimited field `num` of a message.
func firstField(message []byte, num protowire.Number) ([]byte, bool) {
	var found []byte
	err := fields(message, func(n protowire.Number, typ protowire.Type, value []byte) error {
		if n == num && typ == protowire.BytesType {
			found = value
			return errFound
		}
		return nil
	})
	return found, err == errFound
}

// errFound ends a walk of `fields` at what it looked for.
var errFound = errors.New("found")
