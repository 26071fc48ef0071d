// median(numbers): the middle value of the sorted numbers.
export function median(numbers) {
  numbers.sort();
  return numbers[Math.floor(numbers.length / 2)];
}
