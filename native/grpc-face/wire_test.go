package main

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

func field(b []byte, num protowire.Number, value []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, value)
}

func varint(b []byte, num protowire.Number, v uint64) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func TestSplitMapsThePlanFieldsAndTakesTheSample(t *testing.T) {
	spec := field(nil, 1, []byte("json_validator"))
	sample := field(nil, 3, []byte("{}"))
	req := field(nil, evalGraders, spec)
	req = field(req, evalSample, sample)
	req = field(req, evalReward, []byte("r"))
	req = varint(req, evalView, viewColumns)
	req = varint(req, evalCache, 2)
	got, err := splitEvaluate(req)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.sample, sample) {
		t.Fatalf("sample %x, want %x", got.sample, sample)
	}
	want := field(nil, batchGraders, spec)
	want = field(want, batchReward, []byte("r"))
	want = varint(want, batchView, viewScores) // Evaluate answers the columns view as the scores view
	want = varint(want, batchCache, 2)
	if !bytes.Equal(got.plan, want) {
		t.Fatalf("plan %x, want %x", got.plan, want)
	}
}

func TestSplitRefusesWhatItDoesNotKnow(t *testing.T) {
	for name, req := range map[string][]byte{
		"unknown field":   varint(nil, 9, 1),
		"wrong wire type": varint(nil, evalSample, 1),
		"two samples":     field(field(nil, evalSample, nil), evalSample, nil),
		"unknown view":    varint(nil, evalView, 7),
		"truncated":       {0x12, 0x05, 0x01},
	} {
		if _, err := splitEvaluate(req); err == nil {
			t.Errorf("%s: split, want refused", name)
		}
	}
}

func TestBatchRequestAndItemsRoundTrip(t *testing.T) {
	wrapped, req := batchRequest([]byte{0x1a, 0x01, 'r'}, [][]byte{[]byte("a"), {}})
	want := []byte{0x1a, 0x01, 'r', 0x12, 0x01, 'a', 0x12, 0x00}
	if !bytes.Equal(req, want) {
		t.Fatalf("%x, want %x", req, want)
	}
	if w := field(nil, 1, want); !bytes.Equal(wrapped, w) { // BatchEvaluateUnaryRequest{batch}
		t.Fatalf("%x, want %x", wrapped, w)
	}
	one := field(nil, 2, []byte("x")) // index 0 is absent on the wire
	two := field(varint(nil, 1, 1), 2, []byte("yy"))
	msg := field(field(nil, 1, one), 1, two)
	items, err := batchItems(msg)
	if err != nil || len(items) != 2 || items[0].index != 0 || items[1].index != 1 ||
		string(items[0].result) != "x" || string(items[1].result) != "yy" {
		t.Fatalf("%v %v", items, err)
	}
	if _, err := batchItems(field(nil, 2, nil)); err == nil {
		t.Fatal("columns read as items")
	}
}

func TestLeftOutSizeReadsTheEnginesNote(t *testing.T) {
	answer := func(reason string) []byte {
		result := field(field(nil, 1, []byte("k")), 4, []byte(reason))
		return field(field(nil, 1, []byte("id")), 2, result)
	}
	note := leftOutNote + "99998 bytes, over the 100000-byte message limit (max_message_bytes)"
	for reason, want := range map[string]int64{
		note:                    99998,
		"a reason":              -1,
		leftOutNote:             -1,
		leftOutNote + "x bytes": -1,
		leftOutNote + "12":      -1,
	} {
		if got := leftOutSize(answer(reason)); got != want {
			t.Errorf("%q: %d, want %d", reason, got, want)
		}
	}
	if got := leftOutSize(field(nil, 1, []byte("no results"))); got != -1 {
		t.Errorf("no results: %d", got)
	}
}

func TestUnaryAnswerIsTheBatchAnswerItHolds(t *testing.T) {
	items := field(field(nil, 1, field(nil, 2, []byte("x"))), 1, field(varint(nil, 1, 1), 2, []byte("y")))
	got, err := unaryAnswer(field(nil, 1, items))
	if err != nil || !bytes.Equal(got, items) {
		t.Fatalf("%x %v, want %x", got, err, items)
	}
	// given in two parts, the answer is their merge (protobuf's rule for a message field given twice)
	got, err = unaryAnswer(field(field(varint(nil, 9, 3), 1, items[:5]), 1, items[5:]))
	if err != nil || !bytes.Equal(got, items) {
		t.Fatalf("%x %v, want %x", got, err, items)
	}
	if got, err := unaryAnswer(nil); err != nil || len(got) != 0 { // no sample answered: an empty answer
		t.Fatalf("%x %v", got, err)
	}
	if _, err := unaryAnswer([]byte{0x0a, 0x05, 0x01}); err == nil {
		t.Fatal("a truncated answer read")
	}
}
