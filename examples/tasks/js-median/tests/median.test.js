import { test } from 'node:test';
import assert from 'node:assert/strict';
import { median } from '/workspace/median.js';

test('odd count', () => assert.equal(median([5, 1, 3]), 3));
test('even count takes the mean of the middle two', () => assert.equal(median([4, 1, 3, 2]), 2.5));
test('numbers sort numerically', () => assert.equal(median([10, 9, 100]), 10));
test('the input is left as it was', () => {
  const input = [3, 1, 2];
  median(input);
  assert.deepEqual(input, [3, 1, 2]);
});
